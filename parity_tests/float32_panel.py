"""Random float32 cases of every layer kind, for two uses: test_float32.py compares the engine's
float32 error with torch's over a fixed panel of them, and run as a script it surveys many
draws of every kind against the bound of crosscheck/compare.py:

    python -m parity_tests.float32_panel --draws 2000

prints, per kind, the largest error/bound seen for the engine and for torch (above 1 fails;
a whole model's bound allows its rounding spread, crosscheck/rounding.py); its last two
rows, both models' training steps with dropout, are the engine's alone (torch would draw
masks of its own; test_dropout.py hands it the engine's, in float64).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

import numpy as np

import numpy_engine as ne
from crosscheck.compare import float32_checks
from crosscheck.rounding import model_golden
from numpy_engine.cli_args import non_negative_int, positive_int
from numpy_engine.models import IGNORE_INDEX
from parity_tests import layer_cases as cases
from parity_tests.helpers import LayerCase, layer_float32_checks
from parity_tests.strategies import padded_ids, randomize_params


def _sizes(rng: np.random.Generator) -> Callable[[int, int], int]:
    return lambda low, high: int(rng.integers(low, high + 1))


def _heads_and_width(r) -> tuple[int, int]:
    H = r(1, 3)
    return H, r(-(-3 // H), 4)  # d_model >= 3, as model_widths draws it


def _choice(rng, options):
    return options[int(rng.integers(len(options)))]


KINDS: dict[str, Callable[[np.random.Generator], LayerCase]] = {}


def kind(name: str):
    def register(build):
        KINDS[name] = build
        return build

    return register


@kind("linear")
def _(rng):
    r = _sizes(rng)
    return cases.linear(rng, r(1, 4), r(1, 4), r(1, 4), r(1, 4))


@kind("embedding")
def _(rng):
    r = _sizes(rng)
    ids = rng.integers(0, r(2, 6), size=(r(1, 4), r(1, 6)))
    ids[0, 0] = max(int(ids.max()), 1)
    return cases.embedding(rng, ids, r(1, 4))


@kind("layernorm")
def _(rng):
    r = _sizes(rng)
    return cases.layernorm(rng, r(1, 4), r(1, 4), r(3, 8), _choice(rng, [1.0, 1000.0]))


@kind("gelu")
def _(rng):
    r = _sizes(rng)
    return cases.activation(rng, "gelu", r(1, 4), r(1, 4), r(1, 4), _choice(rng, [0.0, -6.0]))


@kind("ffn")
def _(rng):
    r = _sizes(rng)
    return cases.feed_forward(
        rng, _choice(rng, ["relu", "gelu"]), r(1, 4), r(1, 4), r(1, 4), r(1, 8)
    )


@kind("cross-entropy")
def _(rng):
    r = _sizes(rng)
    return cases.cross_entropy(rng, r(1, 4), r(1, 4), r(2, 7), _choice(rng, [0, -100]))


@kind("cross-entropy, confident")
def _(rng):
    r = _sizes(rng)
    return cases.confident_cross_entropy(rng, r(1, 4), r(1, 4), r(2, 7), _choice(rng, [0, -100]))


MASKS = ["none", "causal", "padding", "random"]


@kind("attention")
def _(rng):
    r = _sizes(rng)
    return cases.attention(rng, r(1, 4), r(1, 3), r(1, 4), r(1, 4), r(1, 4), _choice(rng, MASKS))


@kind("attention, scores far from 0")
def _(rng):
    r = _sizes(rng)
    T = r(1, 4)
    offset = _choice(rng, [100.0, -100.0])
    return cases.attention(rng, r(1, 4), r(1, 3), T, T, r(1, 4), _choice(rng, MASKS), offset)


@kind("self-attention")
def _(rng):
    r = _sizes(rng)
    return cases.self_attention(rng, r(1, 4), r(1, 3), r(1, 4), r(1, 4), bool(r(0, 1)))


@kind("cross-attention")
def _(rng):
    r = _sizes(rng)
    return cases.cross_attention(rng, r(1, 4), r(1, 3), r(1, 4), r(1, 4), r(1, 4))


@kind("self-attention block")
def _(rng):
    r = _sizes(rng)
    H, hs = _heads_and_width(r)
    act = _choice(rng, ["relu", "gelu"])
    return cases.self_attention_block(rng, r(1, 4), H, hs, r(1, 4), r(1, 4), act, bool(r(0, 1)))


@kind("decoder block")
def _(rng):
    r = _sizes(rng)
    H, hs = _heads_and_width(r)
    act = _choice(rng, ["relu", "gelu"])
    return cases.decoder_block(rng, r(1, 4), H, hs, r(1, 4), r(1, 4), r(1, 4), act)


# Every layer kind: the panel's, and at fixed small sizes those it leaves out (ReLU, the
# positions, the linear's options), for tests that ask something of every layer.
LAYER_KINDS = KINDS | {
    "relu": lambda rng: cases.activation(rng, "relu", 2, 3, 4),
    "sinusoidal positions": lambda rng: cases.sinusoidal_positions(rng, 2, 3, 4),
    "learned positions": lambda rng: cases.learned_positions(rng, 2, 3, 1, 4),
    "linear, folded affine": lambda rng: cases.linear(rng, 2, 3, 4, 3, affine=True),
    "linear without bias": lambda rng: cases.linear(rng, 2, 3, 4, 3, bias=False),
}


def model_case(model_kind: str, seed: int) -> tuple:
    """A randomized float64 model of that kind ("seq2seq" or "gpt") and a padded batch."""
    rng = np.random.default_rng([seed, 99])
    r = _sizes(rng)
    H, hs = _heads_and_width(r)
    act = _choice(rng, ["relu", "gelu"])
    B, T, V = r(1, 3), r(1, 5), r(3, 9)
    lengths = [r(1, T) for _ in range(B)]
    model, batch = MODEL_CASES[model_kind](rng, r, seed, (H, hs, act), (B, T, V), lengths)
    randomize_params(model, rng)
    return model, batch


def _seq2seq_case(rng, r, seed, heads, sizes, lengths) -> tuple:
    (H, hs, act), (B, T, V) = heads, sizes
    config = ne.Seq2SeqConfig(V, H * hs, H, r(1, 8), r(1, 2), r(1, 2), act, dtype="float64")
    model = ne.Seq2SeqTransformer(config, seed=seed)
    S = r(1, 5)
    source = padded_ids(rng, [r(1, S) for _ in range(B)], S, V)
    return model, (source, padded_ids(rng, lengths, T, V), padded_ids(rng, lengths, T, V))


def _gpt_case(rng, r, seed, heads, sizes, lengths) -> tuple:
    (H, hs, act), (B, T, V) = heads, sizes
    config = ne.GPTConfig(V, H * hs, H, r(1, 8), r(1, 2), T + r(0, 3), act, dtype="float64")
    model = ne.MiniGPT(config, seed=seed)
    targets = rng.integers(0, V, size=(B, T))
    targets[np.arange(T)[None, :] >= np.array(lengths)[:, None]] = IGNORE_INDEX
    return model, (rng.integers(0, V, size=(B, T)), targets)


MODEL_CASES = {"seq2seq": _seq2seq_case, "gpt": _gpt_case}


DROPOUT_RATES = dict(embed_dropout=0.1, attn_dropout=0.3, resid_dropout=0.5)


def dropout_draw(model_kind: str, seed: int) -> dict:
    """The engine's float32 checks of a training step with dropout: model_case's model at
    DROPOUT_RATES, float32 against a float64 golden run on the same float32-rounded weights,
    both under the masks default_rng(seed) draws (the same kept entries: each is a float32
    draw against the rate), under crosscheck/compare.py's bound. The one difference dropout
    adds is its scale, 1/(1 - rate), rounded to float32: a rounding of one factor, as float32
    makes at every operation."""
    model, batch = model_case(model_kind, seed)
    config = dataclasses.replace(model.config, **DROPOUT_RATES)
    model32 = type(model).with_params(config, model.params).with_dtype("float32")

    def compute(exact, _inputs: dict) -> dict:
        return _step_results(exact, batch, seed)

    golden = model_golden(model32, compute, np.random.default_rng(seed))
    return float32_checks(_step_results(model32, batch, seed), *golden)


def _step_results(model, batch: tuple, seed: int) -> dict:
    loss, grads = model.loss_and_grads(*batch, np.random.default_rng(seed))
    return {"loss": np.array(loss)} | {f"dloss/d{key}": g for key, g in grads.items()}


def draw(kind_name: str, seed: int) -> tuple:
    """One case of that kind from seed: (the engine's, torch's) float32 checks."""
    rng = np.random.default_rng([seed, list(KINDS).index(kind_name)])
    case = KINDS[kind_name](rng)
    out, _ = case.forward(case.inputs)
    return layer_float32_checks(case, rng.standard_normal(np.shape(out)), rng)


def worst_ratio(checks: dict) -> float:
    return max(check.ratio for check in checks.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--draws", type=positive_int, default=200, help="cases per kind (default: 200)"
    )
    parser.add_argument("--first-seed", type=non_negative_int, default=1000, help="default: 1000")
    parser.add_argument("--model-draws", type=positive_int, default=None, help="default: --draws")
    args = parser.parse_args()
    from parity_tests.test_models import model_float32_checks  # torch_reference's twins

    def model_draw(model_kind: str, seed: int) -> tuple:
        model, batch = model_case(model_kind, seed)
        rng = np.random.default_rng(seed)
        dlogits = rng.standard_normal(model.forward(*batch[:-1])[0].shape)
        return model_float32_checks(model, batch, dlogits, rng)

    surveys = [(name, lambda seed, name=name: draw(name, seed), args.draws) for name in KINDS]
    model_draws = args.draws if args.model_draws is None else args.model_draws
    for model_kind in ("seq2seq", "gpt"):
        surveys.append((model_kind, lambda s, k=model_kind: model_draw(k, s), model_draws))
    for model_kind in ("seq2seq", "gpt"):  # the engine alone: torch draws masks of its own
        name = f"{model_kind}, dropout"
        surveys.append((name, lambda s, k=model_kind: (dropout_draw(k, s), None), model_draws))
    print(f"{'kind':<30} {'draws':>6} {'engine worst':>13} {'torch worst':>12}  (error / bound)")
    for name, run, draws in surveys:
        engine, torch_ = [], []
        for seed in range(args.first_seed, args.first_seed + draws):
            ours, theirs = run(seed)
            engine.append(worst_ratio(ours))
            if theirs is not None:
                torch_.append(worst_ratio(theirs))
        torch_worst = f"{max(torch_):>12.3f}" if torch_ else f"{'-':>12}"
        print(f"{name:<30} {draws:>6} {max(engine):>13.3f} {torch_worst}", flush=True)


if __name__ == "__main__":
    main()

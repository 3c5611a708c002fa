"""Arrays as a caller may hold them: strided views and read-only arrays. Every layer, model,
decoder and optimizer gives what it gives for fresh contiguous copies of the same values; none
writes into an input it only reads (a read-only input would raise): the optimizers write
the flat parameter vector, in place, and no gradient.

The engine's own calls pass fresh contiguous arrays; a user's need not be. A layer that wrote
through as_rows of a strided array wrote into a copy and returned unwritten memory (GELU's
forward, fixed in 5ff6e45)."""

from __future__ import annotations

import numpy as np
import pytest

from crosscheck.compare import compare, float64_ok
from numpy_engine import attention_blocks as AB
from numpy_engine import blocking, clipping, losses
from numpy_engine.generate import generate, greedy_decode
from numpy_engine.models import GPT2, GPT2Config
from numpy_engine.optim import Adam, AdamW
from numpy_engine.params import flatten
from parity_tests.float32_panel import LAYER_KINDS, model_case
from parity_tests.helpers import layer_outputs


def every_other_column(a: np.ndarray) -> np.ndarray:
    """a's values in a read-only view of every other entry of a twice-as-wide array."""
    return read_only(spread(a))


def spread(a: np.ndarray) -> np.ndarray:
    """a's values in a view of every other entry of a twice-as-wide array."""
    wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]


def fortran_order(a: np.ndarray) -> np.ndarray:
    """A copy of a, read-only, first axis fastest: no row of a (..., C) array is contiguous
    (np.asfortranarray would return a 1-D a itself, and a's flags would change)."""
    return read_only(np.array(a, order="F"))


def read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


LAYOUTS = {"every other column": every_other_column, "Fortran order": fortran_order}


def laid_out(layout, a):
    return a if np.ndim(a) == 0 else LAYOUTS[layout](np.asarray(a))  # a loss's upstream: 0-d


def in_smallest_pieces(monkeypatch) -> None:
    """Every chain of row blocks one row a block, attention one batch row a group and causal
    attention one query a block, the optimizer one entry a block: the paths that cut arrays
    into pieces, at any size."""
    monkeypatch.setattr(blocking, "BLOCK_BYTES", 1)
    monkeypatch.setattr(AB, "WHOLE_BYTES", 0)
    monkeypatch.setattr(AB, "GROUP_BYTES", 1)
    monkeypatch.setattr(AB, "QUERY_BLOCK", 1)
    monkeypatch.setattr(losses, "FUSED_BLOCK_BYTES", 1)
    monkeypatch.setattr(clipping, "BLOCK_BYTES", 8)


PIECES = {"whole": lambda monkeypatch: None, "in pieces": in_smallest_pieces}


@pytest.mark.parametrize("pieces", PIECES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_layers_take_strided_read_only_inputs(kind, layout, pieces, monkeypatch):
    """Outputs and every gradient, the upstream gradient laid out the same way, against the
    contiguous run under the float64 parity rule (a strided reduction may add in another
    order: layernorm's differ by ~5e-16); three cases of each kind."""
    PIECES[pieces](monkeypatch)
    for seed in range(3):
        rng = np.random.default_rng([seed, 5])
        case = LAYER_KINDS[kind](rng)
        out, _ = case.forward(case.inputs)
        dout = rng.standard_normal(np.shape(out))
        want = layer_outputs(case, case.inputs, dout)
        inputs = {key: laid_out(layout, value) for key, value in case.inputs.items()}
        got = layer_outputs(case, inputs, laid_out(layout, dout))
        assert got.keys() == want.keys()
        for key, value in want.items():
            c = compare(f"{case.name}, {layout}: {key}", got[key], value)
            assert float64_ok(c), c.describe()


def gpt2_case(seed: int) -> tuple:
    """A small float64 GPT-2 (its head tied to the embedding) and a batch with ignored
    targets."""
    config = GPT2Config(40, d_model=32, n_heads=4, n_layers=2, max_len=16, dtype="float64")
    model = GPT2(config, seed=seed)
    rng = np.random.default_rng(seed)
    ids, targets = rng.integers(0, 40, (3, 7)), rng.integers(0, 40, (3, 7))
    targets[0, :2] = model.ignore_index()
    return model, (ids, targets)


MODEL_CASES = {
    "seq2seq": lambda seed: model_case("seq2seq", seed),
    "gpt": lambda seed: model_case("gpt", seed),
    "gpt2": gpt2_case,
}


@pytest.mark.parametrize("pieces", PIECES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model_kind", MODEL_CASES)
def test_models_take_strided_read_only_batches(model_kind, layout, pieces, monkeypatch):
    """The loss (MiniGPT's and GPT-2's by the fused readout and loss, in its row blocks when
    in pieces), every gradient and the logits bit for bit: ids are read, not reduced."""
    PIECES[pieces](monkeypatch)
    for seed in range(3):
        model, batch = MODEL_CASES[model_kind](seed)
        loss, grads = model.loss_and_grads(*batch)
        logits, _ = model.forward(*batch[:-1])
        strided = tuple(laid_out(layout, ids) for ids in batch)
        strided_loss, strided_grads = model.loss_and_grads(*strided)
        assert strided_loss == loss
        for key, grad in grads.items():
            np.testing.assert_array_equal(strided_grads[key], grad, err_msg=key)
        np.testing.assert_array_equal(model.forward(*strided[:-1])[0], logits)


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_decoding_takes_a_strided_read_only_prompt(layout, use_cache):
    """Sampled continuations of a MiniGPT and greedy decodes of a Seq2SeqTransformer: the
    same ids."""
    for seed in range(3):
        gpt, (ids, _) = model_case("gpt", seed)
        prompt = np.maximum(ids, 1)
        settings = dict(temperature=1.0, top_k=3, seed=seed, use_cache=use_cache)
        want = generate(gpt, prompt, 5, **settings)
        np.testing.assert_array_equal(generate(gpt, laid_out(layout, prompt), 5, **settings), want)
        seq2seq, (source, *_) = model_case("seq2seq", seed)
        want = greedy_decode(seq2seq, source, 6, use_cache)
        got = greedy_decode(seq2seq, laid_out(layout, source), 6, use_cache)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("pieces", PIECES)
@pytest.mark.parametrize("clip", [None, 0.5], ids=["", "clipped"])
@pytest.mark.parametrize("optimizer", [Adam, AdamW])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_optimizers_take_strided_params_and_gradients(layout, optimizer, clip, pieces, monkeypatch):
    """A step on a strided flat vector (every other entry of a longer one: its pieces are
    views, updated in place) from strided gradients, a dict or a flat vector: the same
    parameters and norm bit for bit."""
    PIECES[pieces](monkeypatch)
    rng = np.random.default_rng(0)
    params = {"a.weight": rng.standard_normal((3, 4)), "a.bias": rng.standard_normal(3)}
    grads = {key: rng.standard_normal(value.shape) for key, value in params.items()}
    flat = flatten(params)
    want_norm = optimizer(params, lr=0.1).step(flat, grads, clip)
    for given in ({key: laid_out(layout, g) for key, g in grads.items()}, flatten(grads)):
        strided = spread(flatten(params))
        given = given if isinstance(given, dict) else every_other_column(given)
        assert optimizer(params, lr=0.1).step(strided, given, clip) == want_norm
        np.testing.assert_array_equal(strided, flat)

"""GPT-2 against Hugging Face transformers' GPT2LMHeadModel, loaded through the real import
path: a random model is saved with save_pretrained and read back by numpy-engine's import-hf.
float64: logits, the loss and every parameter gradient (the tied wte included) within the
1e-10 normwise rule; float32 under the suite's float32 rule; KV-cached decoding against
transformers' past_key_values; greedy generation token for token; sampling's temperature,
top-k and top-p against transformers' warpers; ten AdamW steps.
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, example, given
from hypothesis import strategies as st
from transformers import GPT2Config as HFConfig
from transformers import GPT2LMHeadModel

from crosscheck.compare import compare, float32_checks, float64_ok
from numpy_engine import layers
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.generate import next_token_probabilities
from numpy_engine.hf import engine_params_from_hf, import_hf
from numpy_engine.models import IGNORE_INDEX
from numpy_engine.optim import AdamW, no_decay_keys
from parity_tests.helpers import (
    assert_all_close_float64,
    assert_float32_within_bound,
    engine_results,
    float32_golden,
    only_row_dots,
)
from parity_tests.strategies import seeds


class Case:
    """A random GPT2LMHeadModel (float64, eval mode, eager attention) and the engine's import."""

    def __init__(self, sizes: dict, seed: int, dtype=torch.float64) -> None:
        torch.manual_seed(seed)
        config = HFConfig(**sizes, attn_implementation="eager")
        self.hf = GPT2LMHeadModel(config).to(dtype).eval()
        randomize(self.hf, seed)
        with tempfile.TemporaryDirectory() as directory:
            self.hf.save_pretrained(directory)
            self.engine = load_checkpoint(import_hf(directory, Path(directory) / "run")).model
        self.n_layer = config.n_layer

    def hf_grads(self) -> dict[str, np.ndarray]:
        state = {key: p.grad.numpy().copy() for key, p in self.hf.named_parameters()}
        self.hf.zero_grad()
        return engine_params_from_hf(state, self.n_layer)


def randomize(hf: GPT2LMHeadModel, seed: int) -> None:
    """Every weight redrawn, so no layer sits at its init (zero biases, unit layernorms):
    Conv1D weights N(0, 1/fan_in), embeddings N(0, 1), biases N(0, 0.01), gains 1 + N(0, 0.01)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            fresh = torch.randn(p.shape, generator=generator, dtype=p.dtype)
            if name.endswith(("wte.weight", "wpe.weight")):
                p.copy_(fresh)
            elif p.ndim == 2:  # Conv1D (in, out)
                p.copy_(fresh / math.sqrt(p.shape[0]))
            elif "ln" in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * fresh)
            else:
                p.copy_(0.1 * fresh)


@st.composite
def gpt2_cases(draw) -> tuple[dict, np.ndarray, np.ndarray, int]:
    n_head = draw(st.integers(1, 3))
    # one channel is a degenerate layernorm (test_one_channel_passes_no_gradient_below_ln_f)
    head_width = draw(st.integers(2 if n_head == 1 else 1, 4))
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    sizes = dict(
        vocab_size=draw(st.integers(2, 9)),
        n_embd=n_head * head_width,
        n_head=n_head,
        n_layer=draw(st.integers(1, 2)),
        n_positions=T + draw(st.integers(0, 3)),
    )
    seed = draw(seeds)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, sizes["vocab_size"], (B, T))
    targets = rng.integers(0, sizes["vocab_size"], (B, T))
    lengths = draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    targets[np.arange(T)[None, :] >= np.array(lengths)[:, None]] = IGNORE_INDEX
    return sizes, idx, targets, seed


def hf_results(case: Case, idx, targets, dlogits) -> dict[str, np.ndarray]:
    """As engine_results, from transformers: the loss by F.cross_entropy on its logits (its
    own loss upcasts to float32)."""
    logits = case.hf(torch.tensor(idx)).logits
    logits.backward(torch.tensor(dlogits, dtype=logits.dtype))
    upstream = case.hf_grads()
    logits = case.hf(torch.tensor(idx)).logits
    loss = F.cross_entropy(logits.flatten(0, 1), torch.tensor(targets).flatten())
    loss.backward()
    grads = case.hf_grads()
    return (
        {"logits": logits.detach().numpy(), "loss": loss.detach().numpy()}
        | {f"dloss/d{key}": g for key, g in grads.items()}
        | {f"dlogits-weighted d{key}": g for key, g in upstream.items()}
    )


@given(case=gpt2_cases())
def test_gpt2_matches_transformers(case):
    sizes, idx, targets, seed = case
    idx, targets = np.asarray(idx), np.asarray(targets)
    gpt2 = Case(sizes, seed)
    rng = np.random.default_rng(seed)
    dlogits = rng.standard_normal((*idx.shape, sizes["vocab_size"]))
    ours = engine_results(gpt2.engine, (idx, targets), dlogits)
    assert_all_close_float64("GPT2", ours, hf_results(gpt2, idx, targets, dlogits))
    if sizes["n_embd"] >= 3:  # over 2 channels layernorm's gradients are rounding noise
        model32, dlogits32, golden = float32_golden(gpt2.engine, (idx, targets), dlogits, rng)
        ours32 = engine_results(model32, (idx, targets), dlogits32)
        assert_float32_within_bound("GPT2", float32_checks(ours32, *golden))


def test_gpt2_past_two_query_blocks_matches_transformers(monkeypatch):
    """140 positions, past two attention_blocks.QUERY_BLOCKs: the engine's causal attention runs by
    blocks of queries, transformers' eager attention over every key. Logits, loss and every
    gradient in float64; then greedy generation after a 136-token prompt, whose first pass
    runs by blocks and whose cached steps read the blocks' keys and values, token for token."""
    from numpy_engine import attention
    from numpy_engine.attention_blocks import QUERY_BLOCK
    from numpy_engine.generate import generate

    blocked_runs = []  # one entry a call of attention._blocks_forward: a group by blocks
    by_blocks = attention._blocks_forward

    def counted(*args):
        blocked_runs.append(args[0].shape)
        return by_blocks(*args)

    monkeypatch.setattr(attention, "_blocks_forward", counted)

    T = 140
    assert T > 2 * QUERY_BLOCK
    sizes = dict(vocab_size=9, n_embd=6, n_head=2, n_layer=2, n_positions=T)
    gpt2 = Case(sizes, 5)
    rng = np.random.default_rng(5)
    idx, targets = rng.integers(0, 9, (2, T)), rng.integers(0, 9, (2, T))
    targets[1, -30:] = IGNORE_INDEX
    dlogits = rng.standard_normal((2, T, 9))
    ours = engine_results(gpt2.engine, (idx, targets), dlogits)
    assert_all_close_float64("GPT2 by query blocks", ours, hf_results(gpt2, idx, targets, dlogits))
    assert len(blocked_runs) % 2 == 0 and blocked_runs  # each forward's two layers
    before = len(blocked_runs)
    prompt = idx[:1, :136]
    theirs = gpt2.hf.generate(torch.tensor(prompt), max_new_tokens=4, do_sample=False)
    np.testing.assert_array_equal(generate(gpt2.engine, prompt, 4), theirs.numpy())
    assert len(blocked_runs) == before + 2  # the prompt's pass, by blocks in each layer


ONE_CHANNEL_CASES = [
    (dict(vocab_size=2, n_embd=1, n_head=1, n_layer=1, n_positions=1), [[0]], [[1]], 0),
    (  # found by the explore profile: transformers' zeros came out as 1.7e-12 of rounding
        dict(vocab_size=5, n_embd=1, n_head=1, n_layer=2, n_positions=6),
        [[3, 3, 3], [0, 2, 4]],
        [[4, -100, -100], [3, -100, -100]],
        125230,
    ),
]


@pytest.mark.parametrize("case", ONE_CHANNEL_CASES)
def test_one_channel_passes_no_gradient_below_ln_f(case):
    """A layernorm over one channel outputs its bias whatever its input (x - mean(x) = 0), so
    nothing below the final layernorm gets a gradient: the engine's are exactly 0 (its
    backward subtracts mean(dxhat) = dxhat exactly). transformers' are rounding noise, up to
    1.7e-12 here, which no fixed absolute tolerance tells from a defect. What does carry
    signal, the logits, the loss, the head's half of the tied wte and ln_f's bias, matches."""
    sizes, idx, targets, seed = case
    idx, targets = np.asarray(idx), np.asarray(targets)
    gpt2 = Case(sizes, seed)
    dlogits = np.random.default_rng(seed).standard_normal((*idx.shape, sizes["vocab_size"]))
    ours = engine_results(gpt2.engine, (idx, targets), dlogits)
    theirs = hf_results(gpt2, idx, targets, dlogits)
    signal = ("logits", "loss", "tok_embed.weight", "final_norm.bias")
    carries_signal = {key for key in ours if key.endswith(signal)}
    for key in ours.keys() - carries_signal:
        assert not ours[key].any(), f"{key}: {np.abs(ours[key]).max()} where 0 is exact"
    assert len(carries_signal) == 6  # logits, loss, and two gradients each way
    assert_all_close_float64(
        "GPT2, one channel",
        {key: ours[key] for key in carries_signal},
        {key: theirs[key] for key in carries_signal},
    )


def test_the_tied_head_gradient_is_the_sum_of_both_uses():
    """wte's gradient is the head's use, dlogits^T ln_f(x), plus the embedding's, which only
    the rows of ids in the input receive."""
    model = Case(dict(vocab_size=7, n_embd=6, n_head=2, n_layer=1, n_positions=5), 3).engine
    logits, cache = model.forward(np.array([[1, 2, 3, 4]]))
    dlogits = np.random.default_rng(0).standard_normal(logits.shape)
    both = model.backward(dlogits, cache)["tok_embed.weight"]
    head_only = dlogits.reshape(-1, 7).T @ cache.head[0].reshape(-1, 6)  # the head's input
    unused = [0, 5, 6]
    np.testing.assert_allclose(both[unused], head_only[unused], rtol=1e-13, atol=0)
    assert np.abs(head_only[unused]).min() > 1e-3
    assert np.abs(both - head_only)[[1, 2, 3, 4]].min() > 1e-6  # the embedding's use


SMALL = dict(vocab_size=11, n_embd=8, n_head=2, n_layer=2, n_positions=12)


@pytest.mark.parametrize(
    "large_weights",
    ["", "LARGE_WEIGHT_ENTRIES", "MID_WEIGHT_ENTRIES"],
    ids=["products", "row dots", "transposed products"],
)
def test_kv_cached_logits_match_transformers_past_key_values(large_weights, monkeypatch):
    """large_weights: SMALL's weights take the linear's path for weights of that many entries
    (layers): every decoding step's rows as row dots, or the prompt's and the steps' as
    W @ x.T (in blocks of 5 outputs, the last one short), as GPT-2's do."""
    if large_weights:
        monkeypatch.setattr(layers, large_weights, 1)
        monkeypatch.setattr(layers, "TRANSPOSED_OUTPUTS", 5)
    if large_weights == "LARGE_WEIGHT_ENTRIES":  # not timed against the products: row dots
        monkeypatch.setattr(layers, "FEW_ROW_PATHS", only_row_dots())
    case = Case(SMALL, 5)
    prompt = np.array([[1, 7, 3], [4, 4, 9]])
    new_ids = np.array([[2, 5, 8, 10], [0, 6, 6, 1]])  # fed one at a time
    decoder = case.engine.decoder(prompt)
    out = case.hf(torch.tensor(prompt), use_cache=True)
    errors = []  # np.max, not Python's max, which would pass a NaN over
    for t in range(new_ids.shape[1] + 1):
        ours, theirs = decoder.next_logits(), out.logits[:, -1].detach().numpy()
        errors.append(np.linalg.norm(ours - theirs) / np.linalg.norm(theirs))
        if t < new_ids.shape[1]:
            decoder.append(new_ids[:, t])
            out = cached_step(case.hf, torch.tensor(new_ids[:, t : t + 1]), out)
    assert np.max(errors) <= 1e-12, errors


def cached_step(hf: GPT2LMHeadModel, ids: torch.Tensor, previous):
    """One step through transformers' KV cache (named `cache` from 5.24, before that
    `past_key_values`)."""
    if "cache" in previous:
        return hf(ids, cache=previous.cache, use_cache=True)
    return hf(ids, past_key_values=previous.past_key_values, use_cache=True)


def test_greedy_generation_is_token_identical_to_transformers():
    from numpy_engine.generate import generate

    case = Case(SMALL | {"eos_token_id": 3, "bos_token_id": 3}, 6)
    prompt = np.array([[1, 7, 2, 9]])
    ours = generate(case.engine, prompt, max_new_tokens=8)
    theirs = case.hf.generate(
        torch.tensor(prompt), max_new_tokens=8, do_sample=False, pad_token_id=3
    ).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert ours.shape[1] > prompt.shape[1]
    # the same weights with the third new token as end-of-text: both stop there
    eos = int(ours[0, prompt.shape[1] + 2])
    case = Case(SMALL | {"eos_token_id": eos, "bos_token_id": eos}, 6)
    ours = generate(case.engine, prompt, max_new_tokens=8)
    theirs = case.hf.generate(
        torch.tensor(prompt), max_new_tokens=8, do_sample=False, pad_token_id=eos
    ).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert ours.shape[1] <= prompt.shape[1] + 3 and ours[0, -1] == eos


@st.composite
def sampling_filters(draw):
    """Logit rows of distinct values (a tie at the cut is kept by either side's sort order:
    one of the tied tokens, not the same one), a temperature, top-k and top-p."""
    vocab, rows = draw(st.integers(2, 16)), draw(st.integers(1, 3))
    distinct = st.lists(st.integers(-160, 160), min_size=vocab, max_size=vocab, unique=True)
    logits = np.array([draw(distinct) for _ in range(rows)]) / 8.0  # exact in float64
    temperature = draw(st.floats(0.1, 5.0))
    top_k = draw(st.none() | st.integers(1, vocab + 2))
    top_p = draw(st.none() | st.floats(0.01, 1.0))
    return logits, temperature, top_k, top_p


def warped_by_transformers(logits, temperature, top_k, top_p) -> np.ndarray:
    """The probabilities transformers' generate samples from, its warpers in its order
    (GenerationMixin._get_logits_processor: temperature, top-k, top-p)."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
    warpers += [TopKLogitsWarper(top_k)] if top_k is not None else []
    warpers += [TopPLogitsWarper(top_p)] if top_p is not None and top_p < 1.0 else []
    scores, ids = torch.from_numpy(logits), torch.zeros((len(logits), 1), dtype=torch.long)
    for warper in warpers:
        scores = warper(ids, scores)
    return torch.softmax(scores, dim=-1).numpy()


def top_p_cut_is_clear(logits, temperature, top_k, top_p) -> bool:
    """Whether every token's more likely mass, after temperature and top-k, is off top_p by
    more than rounding: at the cut itself either side's sum may round across it."""
    if top_p is None:
        return True
    probs = np.sort(next_token_probabilities(logits, temperature, top_k), axis=-1)[:, ::-1]
    before = np.cumsum(probs, axis=-1) - probs
    return bool((np.abs(before - top_p) > 1e-12).all())


@given(sampling_filters())
@example((np.log([[0.5, 0.3, 0.15, 0.05]]), 1.0, None, 0.7))  # top-p keeps the first two
@example((np.log([[0.5, 0.3, 0.15, 0.05]]), 0.5, 3, 0.6))  # p^2, top 3: the first has 0.690
@example((np.array([[2.0, 1.0, 1.0, 1.0, 0.0]]), 1.0, 2, None))  # ties at the k-th all kept
def test_sampling_filters_keep_what_transformers_warpers_keep(filters):
    """generate's temperature, top-k and top-p (next_token_probabilities) leave the tokens
    transformers' sampling leaves, at the same probabilities (the float64 rule)."""
    assume(top_p_cut_is_clear(*filters))
    ours, theirs = next_token_probabilities(*filters), warped_by_transformers(*filters)
    np.testing.assert_array_equal(ours > 0, theirs > 0)
    c = compare("sampled probabilities", ours, theirs)
    assert float64_ok(c), c.describe()


def hf_trainer_param_groups(hf: GPT2LMHeadModel, weight_decay: float) -> list[dict]:
    """Hugging Face Trainer's AdamW groups: its decay names (no bias, no LayerNorm) at
    weight_decay, the other parameters at 0."""
    from transformers import Trainer

    decayed = set(Trainer.get_decay_parameter_names(None, hf))  # self is not read
    named = list(hf.named_parameters())  # the tied head's weight once, as wte
    return [
        {"params": [p for name, p in named if name in decayed], "weight_decay": weight_decay},
        {"params": [p for name, p in named if name not in decayed], "weight_decay": 0.0},
    ]


@pytest.mark.parametrize("decayed", ["all", "matrices"])
def test_ten_adamw_steps_follow_torch_adamw(decayed):
    """Fine-tuning's optimizer on the tied model (torch steps the shared wte once): decaying
    every parameter, as torch.optim.AdamW given them all, or the matrices alone
    (no_decay_keys), as Hugging Face's Trainer groups them."""
    case = Case(SMALL, 7)
    model, rng = case.engine, np.random.default_rng(7)
    if decayed == "all":
        ours = AdamW(model.params, lr=1e-3, weight_decay=0.1)
        theirs = torch.optim.AdamW(case.hf.parameters(), lr=1e-3, weight_decay=0.1)
    else:
        no_decay = no_decay_keys(model.params)
        ours = AdamW(model.params, lr=1e-3, weight_decay=0.1, no_decay=no_decay)
        theirs = torch.optim.AdamW(hf_trainer_param_groups(case.hf, 0.1), lr=1e-3)
        undecayed = sum(p.numel() for p in theirs.param_groups[1]["params"])  # c_attn's bias:
        assert 0 < undecayed == sum(model.params[key].size for key in no_decay)  # ours q, k, v
    for _ in range(10):
        idx = rng.integers(0, 11, (2, 6))
        targets = np.roll(idx, -1, axis=1)
        _, grads = model.loss_and_grads(idx, targets)
        ours.step(model.flat, model.flat_grads(grads))
        logits = case.hf(torch.tensor(idx)).logits
        F.cross_entropy(logits.flatten(0, 1), torch.tensor(targets).flatten()).backward()
        theirs.step()
        theirs.zero_grad()
    state = {key: p.detach().numpy() for key, p in case.hf.named_parameters()}
    expected = engine_params_from_hf(state, case.n_layer)
    for key, value in model.params.items():
        error = np.linalg.norm(value - expected[key]) / np.linalg.norm(expected[key])
        # every tensor agrees to ~1e-16 but the key biases (1.3e-10): their true gradient is
        # 0, and Adam divides the two engines' different rounding noise by eps
        assert error <= 1e-9, (key, error)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_benchmarks_twin_is_transformers_with_the_engines_weights(dtype):
    """crosscheck's GPT2Twin, torch_model_for a gpt2 model and the gpt2 benchmark's
    reference: transformers in eval mode, in the engine's dtype, with its weights; the
    same loss and, named back as the engine's, the same gradients."""
    from crosscheck.convert import grads_from_torch, torch_model_for
    from numpy_engine.models import GPT2, GPT2Config

    model = GPT2(GPT2Config(vocab_size=40, max_len=16, dtype=dtype), seed=3)
    twin = torch_model_for(model)
    assert next(twin.parameters()).dtype == getattr(torch, dtype) and not twin.hf.training
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 40, (2, 9))
    targets = np.roll(idx, -1, axis=1)
    targets[:, -1] = IGNORE_INDEX
    loss, grads = model.loss_and_grads(idx, targets)
    theirs = twin.loss(torch.tensor(idx), torch.tensor(targets))
    theirs.backward()
    named = grads_from_torch(twin)  # renamed as the engine's keys (GPT2Twin.engine_named)
    assert sorted(named) == sorted(grads)
    if dtype == "float32":  # the two engines' own rounding: loose, but far below a bug
        assert abs(loss - theirs.item()) <= 1e-5 * abs(loss)
        return
    ours = {"loss": np.array(loss)} | {f"d{key}": g for key, g in grads.items()}
    reference = {"loss": theirs.detach().numpy()} | {f"d{k}": named[k] for k in grads}
    assert_all_close_float64("GPT2Twin", ours, reference)


@pytest.mark.parametrize("dropped", ["transformer.h.0.attn.c_attn.bias", "transformer.wte.weight"])
def test_the_twin_refuses_a_state_that_leaves_a_weight_at_transformers_init(monkeypatch, dropped):
    """A key missing from the state the engine hands to transformers would leave that weight
    at transformers' random init; GPT2Twin names it instead of comparing against it."""
    import crosscheck.hf_twin as hf_twin
    from numpy_engine.models import GPT2, GPT2Config

    model = GPT2(GPT2Config(vocab_size=40, max_len=16, n_layers=1), seed=3)
    full_state = hf_twin.hf_state_from_engine
    monkeypatch.setattr(
        hf_twin,
        "hf_state_from_engine",
        lambda params, n: {k: v for k, v in full_state(params, n).items() if k != dropped},
    )
    with pytest.raises(RuntimeError, match=rf"GPT-2 twin: missing \['{re.escape(dropped)}'"):
        hf_twin.GPT2Twin(model)

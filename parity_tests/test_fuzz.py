"""Malformed input thrown at the public API: every one must raise InputError (a ValueError;
InputTypeError is also a TypeError) whose message names the argument; never another
exception (numpy's own ValueError included), a hang, or a silent NaN.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import numpy_engine as ne
from numpy_engine.checks import InputError
from numpy_engine.generate import generate, greedy_decode
from parity_tests.helpers import record_count

SOURCE = np.array([[4, 5, 6], [7, 8, 0]])
DECODER_INPUT = np.array([[1, 4, 5, 6], [1, 7, 8, 0]])
TARGET = np.array([[4, 5, 6, 2], [7, 8, 2, 0]])
IDX = np.array([[1, 2, 3], [4, 5, 6]])
SEQ2SEQ = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(d_model=8, n_heads=2, d_ff=8), seed=0)
GPT = ne.MiniGPT(ne.GPTConfig(d_model=8, n_heads=2, d_ff=8, n_layers=1, max_len=4), seed=0)


def malformed_ids(shape: tuple[int, int], vocab: int, batch_is_fixed: bool = True):
    """Values that must not pass as a (B, T) id array for this vocabulary (nor, when another
    argument fixes the batch size, as one with a different batch size)."""
    B, T = shape
    ints = st.integers(-(2**40), 2**40)
    malformed = st.one_of(
        st.builds(
            lambda v: np.full(shape, v),
            st.one_of(ints.filter(lambda v: v < 0), st.integers(vocab, 2**40)),
        ),
        st.builds(lambda f: np.full(shape, f), st.floats(allow_nan=True, allow_infinity=True)),
        st.builds(lambda: np.full(shape, True)),
        st.builds(lambda: np.full(shape, "a")),
        st.builds(lambda: np.array([[1], [1, 2]], dtype=object)),
        st.just([[1], [1, 2]]),  # ragged
        st.just(None),
        st.just(np.int64(1)),  # rank 0
        st.builds(lambda n: np.ones(n, dtype=int), st.integers(0, 5)),  # rank 1
        st.builds(lambda: np.ones((B, T, 2), dtype=int)),  # rank 3
        st.builds(lambda: np.ones((0, T), dtype=int)),  # empty batch
        st.builds(lambda: np.ones((B, 0), dtype=int)),  # no time steps
        st.builds(lambda: np.array([[2**70] * T] * B, dtype=object)),
    )
    other_batch = st.builds(
        lambda b: np.ones((b, T), dtype=int), st.integers(1, 6).filter(lambda b: b != B)
    )
    return st.one_of(malformed, other_batch) if batch_is_fixed else malformed


def assert_clear_error(call, argument: str) -> None:
    try:
        call()
    except InputError as error:  # a ValueError or TypeError of numpy's own would be a bug
        assert argument in str(error), f"the message does not name {argument!r}: {error}"
        record_count("malformed inputs refused with a clear error")
        return
    raise AssertionError(f"malformed {argument} was accepted")


@given(which=st.sampled_from(["source", "decoder_input", "target"]), data=st.data())
def test_seq2seq_refuses_malformed_arrays(which, data):
    batch = {"source": SOURCE, "decoder_input": DECODER_INPUT, "target": TARGET}
    batch[which] = data.draw(malformed_ids(batch[which].shape, vocab=12))
    assert_clear_error(lambda: SEQ2SEQ.loss_and_grads(**batch), which)


@given(which=st.sampled_from(["idx", "targets"]), data=st.data())
def test_gpt_refuses_malformed_arrays(which, data):
    batch = {"idx": IDX, "targets": np.roll(IDX, -1, axis=1)}
    batch[which] = data.draw(malformed_ids(batch[which].shape, vocab=13))
    assert_clear_error(lambda: GPT.loss_and_grads(**batch), which)


@given(data=st.data())
def test_all_padding_targets_and_sources_are_refused(data):
    row = data.draw(st.integers(0, 1))
    target, source = TARGET.copy(), SOURCE.copy()
    target[:] = 0
    assert_clear_error(lambda: SEQ2SEQ.loss_and_grads(SOURCE, DECODER_INPUT, target), "target")
    source[row] = 0
    assert_clear_error(lambda: SEQ2SEQ.loss_and_grads(source, DECODER_INPUT, TARGET), "source")
    targets = np.full_like(IDX, -100)
    assert_clear_error(lambda: GPT.loss_and_grads(IDX, targets), "targets")


bad_sizes = st.one_of(
    st.integers(-5, 0),
    st.floats(allow_nan=True),
    st.none(),
    st.text(max_size=3),
    st.booleans(),
    st.just([4]),
)


@given(config_class=st.sampled_from([ne.Seq2SeqConfig, ne.GPTConfig]), data=st.data())
def test_configs_refuse_bad_sizes(config_class, data):
    fields = ["vocab_size", "d_model", "n_heads", "d_ff"]
    fields += ["n_encoder_layers"] if config_class is ne.Seq2SeqConfig else ["n_layers", "max_len"]
    name = data.draw(st.sampled_from(fields))
    value = data.draw(bad_sizes)
    assert_clear_error(lambda: config_class(**{name: value}), name)


@given(d_model=st.integers(1, 64), n_heads=st.integers(1, 16))
def test_configs_refuse_heads_that_do_not_divide(d_model, n_heads):
    if d_model % n_heads:
        assert_clear_error(lambda: ne.GPTConfig(d_model=d_model, n_heads=n_heads), "n_heads")
    else:
        assert ne.GPTConfig(d_model=d_model, n_heads=n_heads).d_model == d_model


@given(data=st.data())
def test_backward_refuses_malformed_upstream_gradients(data):
    logits, cache = GPT.forward(IDX)
    bad = data.draw(
        st.one_of(
            st.builds(lambda: np.ones((2, 3, 12))),
            st.builds(lambda: np.ones(logits.shape, dtype=int)),
            st.builds(
                lambda v: np.full(logits.shape, v), st.sampled_from([np.nan, np.inf, -np.inf])
            ),
            st.just(None),
            st.just([[0.0]]),
        )
    )
    assert_clear_error(lambda: GPT.backward(bad, cache), "dlogits")


def not_a_valid_prompt(value) -> bool:
    """A 1-D array of in-range ids is a valid prompt (one row), unlike for the models."""
    is_ids = isinstance(value, np.ndarray) and value.dtype.kind == "i" and value.ndim == 1
    return not (is_ids and value.size > 0)


@given(data=st.data())
def test_decoding_refuses_malformed_prompts_and_settings(data):
    prompt = data.draw(malformed_ids((1, 3), 13, batch_is_fixed=False).filter(not_a_valid_prompt))
    assert_clear_error(lambda: generate(GPT, prompt, 3), "prompt")
    source = data.draw(malformed_ids((2, 3), vocab=12, batch_is_fixed=False))
    assert_clear_error(lambda: greedy_decode(SEQ2SEQ, source), "source")
    setting, value = data.draw(
        st.sampled_from(
            [
                ("temperature", -0.5),
                ("temperature", "hot"),
                ("top_k", 0),
                ("top_k", 2.5),
                ("top_p", 0.0),
                ("top_p", 1.01),
                ("top_p", "x"),
                ("max_new_tokens", -1),
                ("max_new_tokens", 1.5),
            ]
        )
    )
    assert_clear_error(
        lambda: generate(GPT, IDX[:1], **{"max_new_tokens": 2, setting: value}), setting
    )


def test_valid_inputs_still_give_finite_results():
    loss, grads = SEQ2SEQ.loss_and_grads(SOURCE, DECODER_INPUT, TARGET)
    assert np.isfinite(loss) and all(np.isfinite(g).all() for g in grads.values())

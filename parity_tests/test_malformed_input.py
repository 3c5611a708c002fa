"""Bad input drawn by Hypothesis: malformed id arrays, configs, upstream gradients, prompts
and decoding settings, each of which must raise InputError naming the argument
(test_bad_input.py's rule, its specific mistakes and exact messages there). The strategies
are composite, so a case Hypothesis finds can be pinned with @example.
"""

from __future__ import annotations

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

import numpy_engine as ne
from numpy_engine.checks import InputError
from numpy_engine.generate import generate, greedy_decode
from parity_tests.helpers import record_count
from parity_tests.test_bad_input import DECODER_INPUT, GPT, IDX, SEQ2SEQ, SOURCE, TARGET, TARGETS


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


@st.composite
def malformed_batch(draw, batch: dict, vocab: int) -> tuple[str, dict]:
    """(the argument spoiled, the batch with it replaced by a malformed value)."""
    which = draw(st.sampled_from(list(batch)))
    return which, batch | {which: draw(malformed_ids(batch[which].shape, vocab))}


SEQ2SEQ_BATCH = {"source": SOURCE, "decoder_input": DECODER_INPUT, "target": TARGET}
GPT_BATCH = {"idx": IDX, "targets": TARGETS}


@given(case=malformed_batch(SEQ2SEQ_BATCH, vocab=12))
@example(case=("target", SEQ2SEQ_BATCH | {"target": np.full((2, 4), 2**40)}))
def test_seq2seq_refuses_malformed_arrays(case):
    which, batch = case
    assert_clear_error(lambda: SEQ2SEQ.loss_and_grads(**batch), which)


@given(case=malformed_batch(GPT_BATCH, vocab=13))
def test_gpt_refuses_malformed_arrays(case):
    which, batch = case
    assert_clear_error(lambda: GPT.loss_and_grads(**batch), which)


bad_sizes = st.one_of(
    st.integers(-5, 0),
    st.floats(allow_nan=True),
    st.none(),
    st.text(max_size=3),
    st.booleans(),
    st.just([4]),
)
SIZE_FIELDS = {
    ne.Seq2SeqConfig: ["vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers"],
    ne.GPTConfig: ["vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"],
}


@st.composite
def bad_config_fields(draw) -> tuple:
    config_class = draw(st.sampled_from(list(SIZE_FIELDS)))
    return config_class, draw(st.sampled_from(SIZE_FIELDS[config_class])), draw(bad_sizes)


@given(case=bad_config_fields())
def test_configs_refuse_bad_sizes(case):
    config_class, name, value = case
    assert_clear_error(lambda: config_class(**{name: value}), name)


@given(d_model=st.integers(1, 64), n_heads=st.integers(1, 16))
def test_configs_refuse_heads_that_do_not_divide(d_model, n_heads):
    if d_model % n_heads:
        assert_clear_error(lambda: ne.GPTConfig(d_model=d_model, n_heads=n_heads), "n_heads")
    else:
        assert ne.GPTConfig(d_model=d_model, n_heads=n_heads).d_model == d_model


LOGITS_SHAPE = (2, 4, 13)  # GPT on IDX
malformed_gradients = st.one_of(
    st.builds(lambda: np.ones((2, 4, 12))),
    st.builds(lambda: np.ones(LOGITS_SHAPE, dtype=int)),
    st.builds(lambda v: np.full(LOGITS_SHAPE, v), st.sampled_from([np.nan, np.inf, -np.inf])),
    st.just(None),
    st.just([[0.0]]),
)


@given(bad=malformed_gradients)
@example(bad=np.ones((2, 4, 12)))
def test_backward_refuses_malformed_upstream_gradients(bad):
    _, cache = GPT.forward(IDX)
    assert_clear_error(lambda: GPT.backward(bad, cache), "dlogits")


def not_a_valid_prompt(value) -> bool:
    """A 1-D array of in-range ids is a valid prompt (one row), unlike for the models."""
    is_ids = isinstance(value, np.ndarray) and value.dtype.kind == "i" and value.ndim == 1
    return not (is_ids and value.size > 0)


BAD_SETTINGS = [
    ("temperature", -0.5),
    ("temperature", "hot"),
    ("temperature", float("inf")),
    ("top_k", 0),
    ("top_k", 2.5),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_p", "x"),
    ("max_new_tokens", -1),
    ("max_new_tokens", 1.5),
]


@given(
    prompt=malformed_ids((1, 3), 13, batch_is_fixed=False).filter(not_a_valid_prompt),
    source=malformed_ids((2, 3), vocab=12, batch_is_fixed=False),
    setting=st.sampled_from(BAD_SETTINGS),
)
def test_decoding_refuses_malformed_prompts_and_settings(prompt, source, setting):
    assert_clear_error(lambda: generate(GPT, prompt, 3), "prompt")
    assert_clear_error(lambda: greedy_decode(SEQ2SEQ, source), "source")
    name, value = setting
    assert_clear_error(lambda: generate(GPT, IDX[:1], **{"max_new_tokens": 2, name: value}), name)

"""Both whole models' loss against central finite differences, for every parameter tensor.

float64, padded batches, Hypothesis-drawn configurations; a sample of entries per tensor.
"""

from __future__ import annotations

import numpy as np
from hypothesis import example, given

import numpy_engine as ne
from numpy_engine.gradcheck import check_gradient, sample_indices
from parity_tests.helpers import FD_TOLERANCE, record
from parity_tests.strategies import (
    SMALLEST_GPT,
    SMALLEST_SEQ2SEQ,
    Seq2SeqCase,
    gpt_cases,
    randomize_params,
    seq2seq_cases,
)

ENTRIES_PER_TENSOR = 6


def assert_loss_gradients_match_fd(name, model, loss_fn, grads, rng):
    for key, param in model.params.items():
        indices = sample_indices(rng, param.size, ENTRIES_PER_TENSOR)
        error = check_gradient(loss_fn, param, grads[key], indices, FD_TOLERANCE).error
        record(name, error)
        assert error < FD_TOLERANCE, (
            f"{name}: d{key} relative error {error:.3e} vs finite differences"
        )


# Taught us that a loss can round at ~400x eps * |loss|: at h = 1e-5 the finite
# difference was off by 8e-9; see check_gradient's second step.
ROUNDING_HEAVY_SEQ2SEQ = Seq2SeqCase(
    ne.Seq2SeqConfig(
        vocab_size=9, d_model=2, n_heads=1, d_ff=2, n_decoder_layers=2, dtype="float64"
    ),
    source=np.array([[4, 0, 0]]),
    decoder_input=np.array([[8]]),
    target=np.array([[1]]),
    seed=1,
)


@given(case=seq2seq_cases())
@example(case=SMALLEST_SEQ2SEQ)
@example(case=ROUNDING_HEAVY_SEQ2SEQ)
def test_seq2seq_loss_gradients(case):
    model = ne.Seq2SeqTransformer(case.config, seed=case.seed)
    rng = np.random.default_rng(case.seed)
    randomize_params(model, rng)
    _, grads = model.loss_and_grads(case.source, case.decoder_input, case.target)
    assert grads.keys() == model.params.keys()

    def loss_fn():
        return model.loss(case.source, case.decoder_input, case.target)

    assert_loss_gradients_match_fd("Seq2SeqTransformer loss", model, loss_fn, grads, rng)


@given(case=gpt_cases())
@example(case=SMALLEST_GPT)
def test_gpt_loss_gradients(case):
    model = ne.MiniGPT(case.config, seed=case.seed)
    rng = np.random.default_rng(case.seed)
    randomize_params(model, rng)
    _, grads = model.loss_and_grads(case.idx, case.targets)
    assert grads.keys() == model.params.keys()

    def loss_fn():
        return model.loss(case.idx, case.targets)

    assert_loss_gradients_match_fd("MiniGPT loss", model, loss_fn, grads, rng)

"""Both whole models' loss against central finite differences, for every parameter tensor.

float64, padded batches, Hypothesis-drawn configurations; a sample of entries per tensor.
"""

from __future__ import annotations

import numpy as np
from hypothesis import example, given

import numpy_engine as ne
from numpy_engine.gradcheck import noise_floor, numerical_gradient, relative_error, sample_indices
from parity_tests.helpers import FD_TOLERANCE, record
from parity_tests.strategies import (
    SMALLEST_GPT,
    SMALLEST_SEQ2SEQ,
    gpt_cases,
    randomize_params,
    seq2seq_cases,
)

ENTRIES_PER_TENSOR = 6


def assert_loss_gradients_match_fd(name, model, loss_fn, grads, rng):
    loss_value = loss_fn()
    for key, param in model.params.items():
        indices = sample_indices(rng, param.size, ENTRIES_PER_TENSOR)
        numeric = numerical_gradient(loss_fn, param, indices)
        floor = noise_floor(loss_value, len(indices))
        error = relative_error(grads[key].reshape(-1)[indices], numeric, floor)
        record(name, error)
        assert error < FD_TOLERANCE, (
            f"{name}: d{key} relative error {error:.3e} vs finite differences"
        )


@given(case=seq2seq_cases())
@example(case=SMALLEST_SEQ2SEQ)
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

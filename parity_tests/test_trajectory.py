"""Training trajectories: the engine and torch_reference, same weights, same batches, 30 steps.

Every parameter must agree within 1e-9 relative at the end (float64): forward, backward,
clipping and the optimizer all have to match, step after step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_engine as ne
from crosscheck.compare import compare
from crosscheck.convert import params_from_torch, tensor, torch_model_for
from numpy_engine.optim import Adam, AdamW, clip_grad_norm
from numpy_engine.tasks import DEFAULT_TEXT, CharCorpus, sequence_task

STEPS = 30
RTOL = 1e-9
SCALE_FLOOR = 1e-2  # a real parameter's norm is 0.1 to 10 here


def train_both(model, optimizer, torch_optimizer_class, lr, batches, clip=1.0):
    module = torch_model_for(model)
    torch_optimizer = torch_optimizer_class(module.parameters(), lr=lr)
    losses = []
    for batch in batches:
        loss, grads = model.loss_and_grads(*batch)
        flat_grads = model.flat_grads(grads)
        clip_grad_norm(flat_grads, clip)
        optimizer.step(model.flat, flat_grads)
        torch_optimizer.zero_grad()
        torch_loss = module.loss(*(tensor(x) for x in batch))
        torch_loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        torch_optimizer.step()
        losses.append((loss, torch_loss.item()))
    return params_from_torch(module), losses


def assert_trajectories_match(model, torch_params, losses):
    assert losses[-1][0] < losses[0][0] - 0.1  # it learned something along the way
    for ours, theirs in losses:
        assert abs(ours - theirs) <= RTOL * abs(theirs)
    for key, value in model.params.items():
        c = compare(key, value, torch_params[key])
        # A key bias has a true gradient of exactly 0, so it stays at 0 but for rounding
        # noise, which Adam divides by eps (1e-8) into steps of ~1e-12: relative to its own
        # ~1e-12 norm that noise is 100%. Below SCALE_FLOOR a parameter is judged at that scale.
        assert c.diff_norm <= RTOL * max(c.ref_norm, SCALE_FLOOR), c.describe()


@pytest.mark.parametrize("task_name", ["copy", "reverse"])
def test_seq2seq_adam_with_clipping_follows_torch(task_name):
    task = sequence_task(task_name, seed=7)
    model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(dtype="float64"), seed=7)
    rng = np.random.default_rng(1)
    batches = [task.train.take(rng.integers(0, len(task.train), 32)) for _ in range(STEPS)]
    optimizer = Adam(model.params, lr=1e-3)
    torch_params, losses = train_both(model, optimizer, torch.optim.Adam, 1e-3, batches)
    assert_trajectories_match(model, torch_params, losses)


def test_gpt_adamw_follows_torch():
    corpus = CharCorpus(DEFAULT_TEXT)
    model = ne.MiniGPT(ne.GPTConfig(vocab_size=corpus.vocab_size, dtype="float64"), seed=7)
    rng = np.random.default_rng(1)
    batches = [corpus.batch(rng, 32, 32) for _ in range(STEPS)]
    optimizer = AdamW(model.params, lr=3e-3)
    torch_params, losses = train_both(model, optimizer, torch.optim.AdamW, 3e-3, batches)
    assert_trajectories_match(model, torch_params, losses)

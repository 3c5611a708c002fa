"""The optimizer tests' parameters and gradients: three named views of one flat float64 vector,
as a model holds them, and ten steps of an engine optimizer beside torch's twin on the same
gradients. test_optim.py checks the update rules with them, test_clipping.py the norm,
clipping and the gradients read block by block, test_optimizer_threads.py the step on
the engine's threads.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
import torch
from hypothesis import strategies as st

from crosscheck.compare import compare
from numpy_engine import clipping, optim
from numpy_engine.optim import clip_grad_norm
from numpy_engine.params import flatten, unflatten

SHAPES = {"w": (3, 4), "b": (4,), "e": (5, 2)}
STEPS = 10
RTOL = 1e-12

learning_rates = st.floats(1e-4, 1e-1)
weight_decays = st.sampled_from([0.0, 0.01, 0.1])


def assert_close(name: str, ours: np.ndarray, ref: torch.Tensor) -> None:
    c = compare(name, ours, ref.detach().numpy())
    assert c.diff_norm <= RTOL * c.ref_norm, c.describe()


@contextlib.contextmanager
def block_sizes(block_bytes: int, gather_whole_blocks: int):
    """Optimizers made inside walk their vectors in blocks of block_bytes, and gather a grads
    dict of at most gather_whole_blocks blocks whole."""
    with (
        mock.patch.object(clipping, "BLOCK_BYTES", block_bytes),
        mock.patch.object(optim, "GATHER_WHOLE_BLOCKS", gather_whole_blocks),
    ):
        yield


def random_params(rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """(flat vector, named views of it) with SHAPES, as a model holds its parameters."""
    flat = flatten({key: rng.standard_normal(shape) for key, shape in SHAPES.items()})
    return flat, unflatten(flat, {key: np.empty(shape) for key, shape in SHAPES.items()})


def run_both(engine_optimizer, torch_optimizer, seed: int, grad_scale=1.0, clip=None, fused=False):
    """Ten steps of both on the same random gradients; returns what to compare. With clip,
    torch clips with clip_grad_norm_ before each step, and the engine with clip_grad_norm
    before it or (fused) inside it, step(max_grad_norm=clip)."""
    rng = np.random.default_rng(seed)
    flat, params = random_params(rng)
    tensors = {key: torch.tensor(value, requires_grad=True) for key, value in params.items()}
    ours, theirs = engine_optimizer(params), torch_optimizer(list(tensors.values()))
    clipped_steps = 0
    for _ in range(STEPS):
        grads = {key: grad_scale * rng.standard_normal(shape) for key, shape in SHAPES.items()}
        for key, tensor in tensors.items():
            tensor.grad = torch.tensor(grads[key])
        flat_grads = flatten(grads)
        if clip is None:
            ours.step(flat, flat_grads)
        else:
            torch_norm = float(torch.nn.utils.clip_grad_norm_(list(tensors.values()), clip))
            if fused:
                norm = ours.step(flat, flat_grads, max_grad_norm=clip)
            else:
                norm = clip_grad_norm(flat_grads, clip)
                ours.step(flat, flat_grads)
            assert abs(norm - torch_norm) <= RTOL * torch_norm
            clipped_steps += norm > clip
        theirs.step()
    return params, tensors, ours, theirs, clipped_steps


def assert_state_matches(params, tensors, ours, theirs, state_names):
    assert ours.step_count == STEPS
    for key, tensor in tensors.items():
        assert_close(f"param {key}", params[key], tensor)
        for name in state_names:
            assert_close(f"{name} {key}", ours.state[name][key], theirs.state[tensor][name])

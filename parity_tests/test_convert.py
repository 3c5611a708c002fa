"""The converter: same names, copied weights, strict and checked loading; one-way imports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import numpy_engine as ne
from crosscheck.convert import (
    grads_from_torch,
    load_engine_params,
    params_from_torch,
    torch_model_for,
)

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "seq2seq": lambda: ne.Seq2SeqTransformer(
        ne.Seq2SeqConfig(n_encoder_layers=2, n_decoder_layers=3, dtype="float64"), seed=1
    ),
    "gpt": lambda: ne.MiniGPT(ne.GPTConfig(n_layers=2, activation="relu"), seed=1),
}


@pytest.mark.parametrize("kind", MODELS)
def test_state_dict_keys_shapes_and_values_match_the_engine(kind):
    model = MODELS[kind]()
    module = torch_model_for(model)
    state = params_from_torch(module)
    assert list(state) == list(model.params)  # same names, same order
    for key, value in model.params.items():
        assert state[key].dtype == value.dtype and np.array_equal(state[key], value), key


@pytest.mark.parametrize("kind", MODELS)
def test_weights_are_copied_not_shared(kind):
    model = MODELS[kind]()
    module = torch_model_for(model)
    first_key = next(iter(model.params))
    model.params[first_key] += 1.0
    assert not np.array_equal(params_from_torch(module)[first_key], model.params[first_key])


def test_loading_checks_keys_shapes_and_dtypes():
    model = MODELS["gpt"]()
    module = torch_model_for(model)
    params = dict(model.params)
    with pytest.raises(ValueError, match=r"missing keys \['head.bias'\]"):
        load_engine_params(module, {k: v for k, v in params.items() if k != "head.bias"})
    with pytest.raises(ValueError, match=r"unexpected keys \['extra.weight'\]"):
        load_engine_params(module, params | {"extra.weight": np.zeros(1, np.float32)})
    with pytest.raises(ValueError, match=r"params\['head.weight'\] has shape \(13, 63\)"):
        load_engine_params(module, params | {"head.weight": np.zeros((13, 63), np.float32)})
    with pytest.raises(TypeError, match=r"params\['head.bias'\] has dtype float64"):
        load_engine_params(module, params | {"head.bias": np.zeros(13)})
    assert module.head.weight.dtype == torch.float32


def test_a_model_without_a_twin_is_refused_by_name():
    from numpy_engine.checks import InputError

    class Untwinned(ne.MiniGPT):
        torch_twin = None

    with pytest.raises(InputError, match="a gpt model has no PyTorch twin in torch_reference"):
        torch_model_for(Untwinned(ne.GPTConfig()))


def test_a_parameter_autograd_never_reached_gets_a_zero_gradient():
    """grads_from_torch gives each parameter's .grad, and zeros of its shape for one the
    loss does not depend on (its .grad stays None)."""
    torch.manual_seed(0)
    module = torch.nn.ModuleDict({"used": torch.nn.Linear(3, 2), "unused": torch.nn.Linear(4, 5)})
    module["used"](torch.ones(1, 3)).sum().backward()
    grads = grads_from_torch(module)
    assert module["unused"].weight.grad is None
    assert list(grads) == ["used.weight", "used.bias", "unused.weight", "unused.bias"]
    np.testing.assert_array_equal(grads["used.weight"], np.ones((2, 3), dtype=np.float32))
    np.testing.assert_array_equal(grads["used.bias"], np.ones(2, dtype=np.float32))
    np.testing.assert_array_equal(grads["unused.weight"], np.zeros((5, 4), dtype=np.float32))
    np.testing.assert_array_equal(grads["unused.bias"], np.zeros(5, dtype=np.float32))

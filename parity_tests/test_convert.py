"""The converter: same names, copied weights, strict and checked loading; one-way imports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import numpy_engine as ne
from crosscheck.convert import load_engine_params, params_from_torch, torch_model_for

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

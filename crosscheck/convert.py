"""The one module where numpy_engine meets torch: weights in, parameters and gradients out.

Arrays are copied both ways (torch.tensor copies; .numpy() results are copied), so an
engine model and its torch twin never share memory.
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import torch
from torch import nn

from numpy_engine.checks import InputError, InputTypeError
from numpy_engine.models import Model
from torch_reference import models as torch_models

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}
GPT2_TWIN = "transformers.GPT2LMHeadModel"  # a torch_twin outside torch_reference


def torch_model_for(engine_model: Model) -> nn.Module:
    """The torch_reference twin of an engine model (the class the model names as its
    torch_twin): same config, dtype and weights."""
    if engine_model.torch_twin is None:
        raise InputError(f"a {engine_model.kind} model has no PyTorch twin in torch_reference")
    if engine_model.torch_twin == GPT2_TWIN:  # transformers' model, not torch_reference's
        from crosscheck.hf_twin import GPT2Twin

        return GPT2Twin(engine_model)
    twin = getattr(torch_models, engine_model.torch_twin)
    config = dataclasses.asdict(engine_model.config)
    dtype = TORCH_DTYPES[config.pop("dtype")]
    # the config fields the twin's constructor takes: the architecture's (decoding's special
    # ids, say, are the engine's business)
    accepted = inspect.signature(twin).parameters
    module = twin(**{name: value for name, value in config.items() if name in accepted})
    module = module.to(dtype).eval()  # its dropout (if any) off: a test turns it on with .train()
    load_engine_params(module, engine_model.params)
    return module


def load_engine_params(module: nn.Module, params: dict[str, np.ndarray]) -> None:
    """Copy params into module with strict=True, after checking keys, shapes and dtypes."""
    expected = module.state_dict()
    missing, extra = expected.keys() - params.keys(), params.keys() - expected.keys()
    if missing or extra:
        raise InputError(f"params: missing keys {sorted(missing)}, unexpected keys {sorted(extra)}")
    for key, tensor in expected.items():
        value = params[key]
        if tuple(value.shape) != tuple(tensor.shape):
            raise InputError(
                f"params[{key!r}] has shape {value.shape}, torch expects {tuple(tensor.shape)}"
            )
        if torch.tensor(value[:0]).dtype != tensor.dtype:
            raise InputTypeError(
                f"params[{key!r}] has dtype {value.dtype}, torch expects {tensor.dtype}"
            )
    module.load_state_dict({key: torch.tensor(value) for key, value in params.items()}, strict=True)


def params_from_torch(module: nn.Module) -> dict[str, np.ndarray]:
    return {key: value.detach().numpy().copy() for key, value in module.state_dict().items()}


def grads_from_torch(module: nn.Module) -> dict[str, np.ndarray]:
    """Each parameter's .grad as an array keyed like the engine's params; a parameter
    autograd never reached gets zeros. A twin whose names differ (GPT2Twin) renames them."""
    grads = {
        name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().numpy().copy()
        for name, p in module.named_parameters()
    }
    return module.engine_named(grads) if hasattr(module, "engine_named") else grads


def tensor(array: np.ndarray) -> torch.Tensor:
    """A copy (never torch.from_numpy on a possibly read-only view, which warns)."""
    return torch.tensor(np.asarray(array))

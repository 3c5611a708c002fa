"""Parameter initialisation helpers, and flatten/unflatten: a model's params are named views
of one flat vector (models/base.py), which the optimizer updates block by block (optim.py).

Each helper returns a dict keyed like the PyTorch submodule it mirrors
(weight/bias, q_proj.weight, ln1.bias, ...); the models prefix and merge them.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from numpy_engine import checks
from numpy_engine.checks import InputError, InputTypeError
from numpy_engine.keys import with_prefix

Init = Callable[[tuple[int, ...]], np.ndarray]


def linear_params(init: Init, out_features: int, in_features: int) -> dict:
    return {"weight": init((out_features, in_features)), "bias": np.zeros(out_features)}


def layernorm_params(channels: int) -> dict:
    return {"weight": np.ones(channels), "bias": np.zeros(channels)}


def attention_params(init: Init, C: int) -> dict:
    params = {}
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        params.update(with_prefix(linear_params(init, C, C), f"{proj}."))
    return params


def ffn_params(init: Init, C: int, F: int) -> dict:
    fc1 = with_prefix(linear_params(init, F, C), "fc1.")
    return {**fc1, **with_prefix(linear_params(init, C, F), "fc2.")}


def self_block_params(init: Init, C: int, F: int) -> dict:
    return {
        **with_prefix(layernorm_params(C), "ln1."),
        **with_prefix(attention_params(init, C), "attn."),
        **with_prefix(layernorm_params(C), "ln2."),
        **with_prefix(ffn_params(init, C, F), "ffn."),
    }


def decoder_block_params(init: Init, C: int, F: int) -> dict:
    return {
        **with_prefix(layernorm_params(C), "ln1."),
        **with_prefix(attention_params(init, C), "self_attn."),
        **with_prefix(layernorm_params(C), "ln2."),
        **with_prefix(attention_params(init, C), "cross_attn."),
        **with_prefix(layernorm_params(C), "ln3."),
        **with_prefix(ffn_params(init, C, F), "ffn."),
    }


def flatten(arrays: dict[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """All arrays raveled and concatenated in key order: one vector (new, or out)."""
    return np.concatenate(list(arrays.values()), axis=None, out=out)  # axis=None ravels each


def unflatten(flat: np.ndarray, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Views into flat, shaped like each array of `like`, in key order: flatten's inverse."""
    views, offset = {}, 0
    for key, value in like.items():
        views[key] = flat[offset : offset + value.size].reshape(value.shape)
        offset += value.size
    return views


def check_params(params: dict, expected: dict) -> None:
    """Same keys, shapes and dtypes as expected, and finite values."""
    check_param_keys(params.keys(), expected)
    for key, ref in expected.items():
        check_param(key, params[key], ref)


def check_param_keys(keys, expected: dict) -> None:
    missing, extra = expected.keys() - set(keys), set(keys) - expected.keys()
    if missing or extra:
        raise InputError(f"params: missing keys {sorted(missing)}, unexpected keys {sorted(extra)}")


def check_param(key: str, value, ref: np.ndarray) -> None:
    """value has ref's shape and dtype, and finite values."""
    if not isinstance(value, np.ndarray) or value.shape != ref.shape:
        got = getattr(value, "shape", type(value).__name__)
        raise InputError(f"params[{key!r}] must have shape {ref.shape}, got {got}")
    if value.dtype != ref.dtype:
        raise InputTypeError(f"params[{key!r}] must have dtype {ref.dtype}, got {value.dtype}")
    checks.check_finite(f"params[{key!r}]", value)

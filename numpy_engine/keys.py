"""Parameter keys: a layer's params and grads are keyed by their local names ("weight",
"q_proj.bias"), a model's by the full PyTorch state_dict key ("decoder.0.ln1.weight")."""

from __future__ import annotations

import numpy as np


def sub(params: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The entries under prefix, with the prefix removed: sub(p, "attn.")["q_proj.weight"]."""
    return {key[len(prefix) :]: value for key, value in params.items() if key.startswith(prefix)}


def with_prefix(grads: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The inverse of sub: put the prefix back on every key."""
    return {prefix + key: value for key, value in grads.items()}

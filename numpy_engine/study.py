"""What the `grads` command shows: gradient norms next to their finite-difference estimates."""

from __future__ import annotations

import numpy as np

from numpy_engine.gradcheck import check_gradient, sample_indices
from numpy_engine.models import model_class


def example_batch(kind: str, seed: int) -> tuple:
    """The default model of that kind in float64, and one padded batch, all from seed."""
    model_type = model_class(kind)
    model = model_type(model_type.config_class(dtype="float64"), seed=seed)
    return model, model_type.example_batch(model.config, np.random.default_rng(seed), 4)


def gradient_study(kind: str, seed: int, entries: int = 4) -> tuple[float, list[dict]]:
    """The loss, and per parameter: gradient norm, and on `entries` sampled entries the
    analytic values' norm, the finite-difference estimate's norm, and their relative error."""
    model, batch = example_batch(kind, seed)
    loss, grads = model.loss_and_grads(*batch)
    rng = np.random.default_rng(seed)
    rows = []
    for key, param in model.params.items():
        indices = sample_indices(rng, param.size, entries)
        # judged against the finite difference's own rounding (a key bias's true gradient is 0)
        check = check_gradient(lambda: model.loss(*batch), param, grads[key], indices)
        analytic = grads[key].reshape(-1)[indices]
        rows.append(
            {
                "name": key,
                "shape": param.shape,
                "grad_norm": float(np.linalg.norm(grads[key])),
                "sampled_norm": float(np.linalg.norm(analytic)),
                "fd_norm": float(np.linalg.norm(check.numeric)),
                "rel_error": check.error,
            }
        )
    return loss, rows

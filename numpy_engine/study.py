"""What the `grads` command shows: gradient norms next to their finite-difference estimates."""

from __future__ import annotations

import fnmatch

import numpy as np

from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.checks import InputError
from numpy_engine.gradcheck import TOLERANCE, check_gradient, rounding_noise, sample_indices
from numpy_engine.models import model_class

EXAMPLE_ROWS = 4  # the one padded batch's rows, for a default model and a checkpoint's alike
# a checkpoint's batch has at most this many positions: at a real GPT-2's 1024, its float64
# logits alone would be 4 x 1024 x 50257 x 8 bytes, 1.6 GB (in each library, for `parity`)
CHECKPOINT_LENGTH = 32


def example_batch(kind: str, seed: int) -> tuple:
    """The default model of that kind in float64, and one padded batch, all from seed."""
    model_type = model_class(kind)
    model = model_type(model_type.config_class(dtype="float64"), seed=seed)
    return model, model_type.example_batch(model.config, np.random.default_rng(seed), EXAMPLE_ROWS)


def checkpoint_example(path: str, seed: int) -> tuple:
    """A checkpoint's model (its weights, in float64) and one padded batch of EXAMPLE_ROWS
    rows drawn from seed, as example_batch draws it for the kind's default model."""
    model = load_checkpoint(path, optimizer=False).model.with_dtype("float64")
    config = model.config
    length = min(config.max_len, CHECKPOINT_LENGTH) if hasattr(config, "max_len") else None
    batch = type(model).example_batch(config, np.random.default_rng(seed), EXAMPLE_ROWS, length)
    return model, batch


def gradient_study(
    kind: str, seed: int, entries: int = 4, checkpoint: str | None = None, only: str = "*"
) -> tuple[float, list[dict]]:
    """The loss, and per parameter: gradient norm, and on `entries` sampled entries the
    analytic values' norm, the finite-difference estimate's norm, their relative error, and
    its verdict: "pass" within gradcheck.TOLERANCE, "FAIL" above it, "n/a" where no sampled
    entry could be judged (each sat on a kink, such as ReLU's 0, that no step avoids). Given
    checkpoint, the model it holds instead of kind's default (checkpoint_example). only: a
    shell-style pattern; the parameters whose names match it, each row as in the whole study
    (the same sampled entries, judged against the same rounding)."""
    if checkpoint is None:
        model, batch = example_batch(kind, seed)
    else:
        model, batch = checkpoint_example(checkpoint, seed)
    chosen = matching_names(model.params, only)
    loss, grads = model.loss_and_grads(*batch)
    rng = np.random.default_rng(seed)
    sampled = {key: sample_indices(rng, p.size, entries) for key, p in model.params.items()}
    analytic = {key: grads[key].reshape(-1)[indices] for key, indices in sampled.items()}

    def probe() -> float:
        return model.loss(*batch)

    # judged against the finite difference's own rounding (a key bias's true gradient is 0),
    # measured once: it is the loss's, whichever entry moves
    noise = loss_rounding(probe, model.params, sampled, analytic)
    rows = []
    for key in chosen:
        param = model.params[key]
        check = check_gradient(probe, param, grads[key], sampled[key], noise=noise)
        rows.append(
            {
                "name": key,
                "shape": param.shape,
                "grad_norm": float(np.linalg.norm(grads[key])),
                "sampled_norm": float(np.linalg.norm(analytic[key])),
                "fd_norm": float(np.linalg.norm(check.numeric)),
                "rel_error": check.error,
                "verdict": verdict(check.error),
            }
        )
    return loss, rows


def matching_names(params: dict, pattern: str) -> list[str]:
    """The names in params that the shell-style pattern matches (fnmatch, case-sensitive), in
    the model's order; none is refused, naming a few of the model's."""
    names = [key for key in params if fnmatch.fnmatchcase(key, pattern)]
    if not names:
        some = ", ".join(list(params)[:3])
        raise InputError(
            f"--params {pattern!r} matches none of the model's {len(params)} parameters "
            f"(they are named like {some}, ...)"
        )
    return names


def verdict(error: float) -> str:
    """gradient_study's verdict on a relative error (NaN: none of the entries judged)."""
    if np.isnan(error):
        return "n/a"
    return "pass" if error <= TOLERANCE else "FAIL"


def loss_rounding(probe, params: dict, sampled: dict, analytic: dict) -> float:
    """rounding_noise of the loss along the sampled entry with the largest gradient (analytic:
    each parameter's gradient at its sampled entries): once for every parameter, not once each
    (nine evaluations of the loss a parameter, two thirds of a study of one entry each)."""
    key = max(analytic, key=lambda k: np.abs(analytic[k]).max())
    entry = sampled[key][np.argmax(np.abs(analytic[key]))]
    return rounding_noise(probe, params[key], int(entry))

"""Normwise comparison of two arrays, with a report of the worst element.

float64: ||ours - ref|| <= FLOAT64_ATOL + FLOAT64_RTOL * ||ref||.
float32: judged against a float64 golden run. On each tensor the engine's float32
error ||x32 - golden|| may be at most FLOAT32_FACTOR times torch's float32 error,
plus FLOAT32_SLACK times the largest golden norm in the case. Torch's error on a
tensor is taken as the larger of its error there and its worst relative error in the
case applied to that tensor's norm: where a gradient is a sum that cancels, either
engine's rounding lands by luck, and one lucky torch tensor must not fail the engine.
The slack is relative to the case's scale because float32 rounds every tensor at
~1e-7 of the large ones it is computed from (a truly zero key-bias gradient is pure
rounding noise in both engines).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

FLOAT64_RTOL = 1e-10
FLOAT64_ATOL = 1e-12
FLOAT32_FACTOR = 4.0
FLOAT32_SLACK = 1e-6


class Comparison(NamedTuple):
    name: str
    shape: tuple
    max_abs: float  # largest |ours - ref| over elements
    rel: float  # ||ours - ref|| / ||ref||, normwise (inf if ref is 0 and ours is not)
    diff_norm: float
    ref_norm: float
    worst_index: tuple
    ours_value: float
    ref_value: float

    def describe(self) -> str:
        return (
            f"{self.name} {self.shape}: normwise relative difference {self.rel:.3e}, "
            f"max abs {self.max_abs:.3e} at {self.worst_index}: "
            f"ours {self.ours_value!r} vs reference {self.ref_value!r}"
        )


def compare(name: str, ours: np.ndarray, ref: np.ndarray) -> Comparison:
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        raise AssertionError(f"{name}: shape {ours.shape} differs from the reference's {ref.shape}")
    diff = np.abs(ours - ref)
    worst = np.unravel_index(np.argmax(diff), diff.shape) if diff.size else ()
    diff_norm, ref_norm = float(np.linalg.norm(diff)), float(np.linalg.norm(ref))
    rel = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else np.inf)
    return Comparison(
        name, ours.shape, float(diff.max(initial=0.0)), rel, diff_norm, ref_norm,
        tuple(int(i) for i in worst), float(ours[worst]), float(ref[worst]),
    )  # fmt: skip


def float64_ok(c: Comparison) -> bool:
    return c.diff_norm <= FLOAT64_ATOL + FLOAT64_RTOL * c.ref_norm


class Float32Check(NamedTuple):
    engine_error: float  # ||engine32 - golden||
    torch_error: float  # torch's error on this tensor, as defined above
    bound: float  # FLOAT32_FACTOR * torch_error + FLOAT32_SLACK * case scale
    golden_norm: float

    @property
    def ok(self) -> bool:
        return self.engine_error <= self.bound


def float32_checks(ours32: dict, torch32: dict, golden: dict) -> dict[str, Float32Check]:
    """Per tensor of one case: the engine's float32 error and the bound it must stay under."""

    def error(x, key):
        return float(np.linalg.norm(np.asarray(x[key], np.float64) - golden[key]))

    norms = {key: float(np.linalg.norm(golden[key])) for key in golden}
    scale = max(norms.values())
    torch_errors = {key: error(torch32, key) for key in golden}
    torch_worst_rate = max(
        (torch_errors[key] / norms[key] for key in golden if norms[key] > 1e-6 * scale),
        default=0.0,
    )
    checks = {}
    for key in golden:
        torch_error = max(torch_errors[key], torch_worst_rate * norms[key])
        bound = FLOAT32_FACTOR * torch_error + FLOAT32_SLACK * scale
        checks[key] = Float32Check(error(ours32, key), torch_error, bound, norms[key])
    return checks

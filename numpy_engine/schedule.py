"""Learning-rate schedules: a warmup, then a constant, linear or cosine learning rate.

The lr of a run's update number k (0 for its first update, steps - 1 for its last) is
lr * factor(k), with factor as Hugging Face transformers' schedules define it (the
lr_lambda its `get_*_schedule_with_warmup` give torch's LambdaLR), W the warmup steps,
N the run's steps and r = min_lr / lr:

    k < W:       factor = k / W              (update 0 has lr 0; update W - 1 lr (W-1)/W)
    constant:    factor = 1
    linear:      factor = d (1 - r) + r,     d = (N - k) / (N - W)
    cosine:      factor = c (1 - r) + r,     c = (1 + cos(pi (k - W) / (N - W))) / 2

The decaying schedules fall from lr at update W towards min_lr, which they would reach at
update N, one past the last. The arithmetic is transformers' term for term, so the
factors are its own to the last bit (parity_tests/test_schedule.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral, Real

from numpy_engine.checks import InputError, check_non_negative_int, check_positive_int

SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(k: int, schedule: str, warmup: int, steps: int, min_ratio: float = 0.0) -> float:
    """What the lr of update k (from 0) is multiplied by; see the module's docstring. A k
    past the run's end is taken as transformers' schedules take it."""
    _check_factor_arguments(k, schedule, warmup, steps, min_ratio)
    if k < warmup:
        return float(k) / float(warmup)  # warmup > k >= 0: transformers' max(1, warmup)
    if schedule == "constant":
        return 1.0
    after_warmup = float(max(1, steps - warmup))
    if schedule == "linear":
        decay = float(steps - k) / after_warmup
    else:  # a half cosine wave (transformers' pi * 0.5 * 2.0 is pi exactly: the same bits)
        decay = 0.5 * (1.0 + math.cos(math.pi * (float(k - warmup) / after_warmup)))
    return max(0.0, decay * (1 - min_ratio) + min_ratio)  # never below 0, for k past the end


def _check_factor_arguments(k, schedule, warmup, steps, min_ratio) -> None:
    """lr_factor's arguments as check_schedule holds a run's (an unknown schedule would
    otherwise read as cosine)."""
    if schedule not in SCHEDULES:
        raise InputError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    check_positive_int("steps", steps)
    if isinstance(warmup, bool) or not isinstance(warmup, Integral) or not 0 <= warmup < steps:
        raise InputError(f"warmup must be an int in [0, steps={steps}), got {warmup!r}")
    check_non_negative_int("k, the update's number from 0,", k)
    number = isinstance(min_ratio, Real) and not isinstance(min_ratio, bool)
    if not (number and 0 <= min_ratio <= 1):  # min_lr / lr; False for NaN too
        raise InputError(f"min_ratio must be a number in [0, 1], got {min_ratio!r}")


def scheduled_lr(cfg, k: int) -> float:
    """The lr of a run's update k (from 0) under cfg's lr, schedule, warmup, steps, min_lr."""
    factor = lr_factor(k, cfg.schedule, cfg.warmup, cfg.steps, cfg.min_lr / cfg.lr)
    return cfg.lr * factor


def is_scheduled(cfg) -> bool:
    """Whether cfg's lr changes during the run (a warmup, or a decay)."""
    return cfg.warmup > 0 or cfg.schedule != "constant"


def check_schedule(cfg, name: Callable[[str], str] = str) -> None:
    """cfg's schedule settings, each named when it is wrong (lr and steps are checked first),
    by name(field): the field itself, or the command line's flag for it."""
    if cfg.schedule not in SCHEDULES:
        raise InputError(
            f"{name('schedule')} must be one of {', '.join(SCHEDULES)}, got {cfg.schedule!r}"
        )
    warmup = cfg.warmup
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup < cfg.steps:
        raise InputError(
            f"{name('warmup')} must be an int in [0, {name('steps')}={cfg.steps}): the steps "
            f"whose lr rises to {name('lr')}, got {warmup!r}"
        )
    if not 0 <= cfg.min_lr <= cfg.lr:  # False for NaN too
        raise InputError(
            f"{name('min_lr')} must be in [0, {name('lr')}={cfg.lr}], got {cfg.min_lr}"
        )
    if cfg.min_lr and cfg.schedule == "constant":
        raise InputError(
            f"{name('min_lr')}={cfg.min_lr} is where a decaying schedule ends: give "
            f"{name('schedule')} linear or cosine with it (constant keeps {name('lr')})"
        )

"""Dropout, as GPT-2 trains with it: during a training step each entry at a dropout site is
kept with probability 1 - rate and then scaled by 1 / (1 - rate), so its expected value is
unchanged, or else set to 0. Evaluation, generation and the study commands drop nothing.

The forward multiplies by a mask of 0 and 1 / (1 - rate); the backward multiplies the
gradient by the same mask (docs/gradients.md#dropout). A step's masks are drawn from a
generator keyed by the run's seed, the step and the micro-batch (training_rng), so a resumed
run draws the masks the uninterrupted run drew, and there is no generator state to save.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from numpy_engine.checks import InputError, check_non_negative_int

DROPOUT_STREAM = 2  # default_rng([seed, 2, ...]): the batch sampler is stream 1 (train.py)
SITES = ("embed", "attn", "resid")  # after the embeddings; on attention weights; on the
# attention's and the FFN's outputs before they join the residual (Hugging Face's embd_pdrop,
# attn_pdrop and resid_pdrop)


def check_rate(name: str, rate: float) -> float:
    """A dropout rate in [0, 1): at 1 nothing would be kept and the scale 1 / (1 - rate)
    would be infinite."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise InputError(f"{name}={rate!r} must be a number in [0, 1)")
    return float(rate)


@dataclass(frozen=True)
class Dropout:
    """One training step's dropout: each site's rate and the generator its masks come from.
    Masks are drawn in the order the forward reaches the sites."""

    rng: np.random.Generator
    embed: float = 0.0
    attn: float = 0.0
    resid: float = 0.0

    def mask(self, site: str, shape: tuple, dtype) -> np.ndarray | None:
        """A fresh mask for `site`, shaped like the array it multiplies: 1 / (1 - rate) where
        the entry is kept, else 0; None when the site's rate is 0 (nothing is dropped)."""
        rate = getattr(self, site)
        if rate == 0:
            return None
        kept = self.rng.random(shape, dtype=np.float32) >= rate  # P(kept) = 1 - rate
        return np.multiply(kept, 1.0 / (1.0 - rate), dtype=dtype)


def every_site(rate: float) -> dict[str, float]:
    """A model config's rate fields, every site at rate: {"embed_dropout": rate, ...}."""
    return {f"{site}_dropout": rate for site in SITES}


def check_rates(config) -> None:
    """A model config's rates (its embed_dropout, attn_dropout and resid_dropout fields)."""
    for site in SITES:
        check_rate(f"{site}_dropout", getattr(config, f"{site}_dropout"))


def drops(config) -> bool:
    """Whether the config's training steps drop anything: a rate above 0 (a config without
    the fields: no)."""
    return any(getattr(config, f"{site}_dropout", 0) > 0 for site in SITES)


def step_dropout(config, rng: np.random.Generator | None) -> Dropout | None:
    """A training step's Dropout at the config's rates, its masks from rng; None (nothing is
    dropped) without a generator or without a rate above 0."""
    if rng is None or not drops(config):
        return None
    return Dropout(rng, **{site: getattr(config, f"{site}_dropout") for site in SITES})


def site_mask(dropout: Dropout | None, site: str, shape: tuple, dtype) -> np.ndarray | None:
    """dropout.mask(site, ...), or None when there is no dropout (evaluation)."""
    return None if dropout is None else dropout.mask(site, shape, dtype)


def dropped(x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """x times the mask, in place (x must be a fresh array no cache holds); x if no mask."""
    if mask is not None:
        x *= mask
    return x


def dropped_copy(x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """x times the mask as a new array, for an x that is needed again; x itself if no mask."""
    return x if mask is None else x * mask


def training_rng(seed: int, step: int, part: int = 0) -> np.random.Generator:
    """The generator of a step's masks: micro-batch or rank `part` of step `step`."""
    for name, value in (("seed", seed), ("step", step), ("part", part)):
        check_non_negative_int(name, value)
    return np.random.default_rng([seed, DROPOUT_STREAM, step, part])

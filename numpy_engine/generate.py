"""Decoding: greedy from a source (a model that reads one, as the encoder-decoder); greedy or
sampled continuation of a prompt (a decoder-only model, as MiniGPT).

Each model kind gives its step-by-step decoder (model.decoder): by default it runs only
the new position through a KV cache; use_cache=False reruns the whole prefix, the simple path.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from numpy_engine import checks
from numpy_engine.checks import InputError, InputTypeError
from numpy_engine.models import Model


def greedy_decode(
    model: Model, source: np.ndarray, max_new_tokens: int = 4, use_cache: bool = True
) -> np.ndarray:
    """(B, max_new_tokens) ids: the argmax at each step, EOS included; after EOS, PAD
    (the model config's eos_id and pad_id).

    use_cache=False reruns the decoder on the whole prefix each step (the simple path).
    """
    if model.continues_prompt:
        raise InputError(f"greedy_decode reads a source; a {model.kind} model continues a prompt")
    _check_count("max_new_tokens", max_new_tokens, minimum=1)
    decoder = model.decoder(source, use_cache)  # checks the source
    PAD, EOS = model.config.pad_id, model.config.eos_id
    source = np.asarray(source)
    generated = np.full((source.shape[0], max_new_tokens), PAD)
    finished = np.zeros(source.shape[0], dtype=bool)
    for t in range(max_new_tokens):
        next_ids = np.where(finished, PAD, decoder.next_logits().argmax(axis=-1))  # done: PAD
        generated[:, t] = next_ids
        finished |= next_ids == EOS
        if finished.all() or t == max_new_tokens - 1:
            break
        decoder.append(next_ids)
    return generated


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InputTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise InputError(f"{name} must be at least {minimum}, got {value}")


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, int | float | np.floating):
        raise InputTypeError(f"temperature must be a number, got {type(temperature).__name__}")
    # inf is refused too: logits / inf are all 0, a uniform draw in which top-k keeps every tie
    if not 0 <= temperature < math.inf:  # False for NaN too
        raise InputError(f"temperature must be finite and >= 0 (0 means greedy), got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise InputError(f"top_k must be a positive int, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, int | float)):
        raise InputTypeError(f"top_p must be a number, got {type(top_p).__name__}")
    if top_p is not None and not 0 < top_p <= 1:
        raise InputError(f"top_p must be in (0, 1], got {top_p}")


def next_token_probabilities(
    logits: np.ndarray, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> np.ndarray:
    """(B, V) probabilities from last-position logits (B, V), after temperature, top-k, top-p."""
    scaled = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < scaled.shape[-1]:
        kth_largest = np.sort(scaled, axis=-1)[:, -top_k][:, None]
        scaled = np.where(scaled >= kth_largest, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1:
        order = np.argsort(-probs, axis=-1)  # most likely first
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        before = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass of the more likely ones
        keep_sorted = before < top_p  # the smallest set reaching top_p; the first always stays
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def sample_next(
    logits: np.ndarray,
    rng: np.random.Generator,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> np.ndarray:
    """(B,) next ids: argmax when temperature is 0, else a draw from the filtered softmax."""
    if temperature == 0:
        return logits.argmax(axis=-1)
    probs = next_token_probabilities(logits, temperature, top_k, top_p)  # (B, V)
    cumulative = np.cumsum(probs, axis=-1)
    draws = rng.random((probs.shape[0], 1)) * cumulative[:, -1:]
    return (cumulative <= draws).sum(axis=-1)  # first index whose cumulative mass passes the draw


def generate(
    model: Model,
    prompt: np.ndarray,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    use_cache: bool = True,
) -> np.ndarray:
    """prompt (B, T0) ids -> (B, T0 + n) ids, n = max_new_tokens, or fewer when every row has
    produced the config's eos_id (a row that has repeats it). The model sees the last
    max_len ids."""
    ids = _checked_prompt(model, prompt, max_new_tokens, temperature, top_k, top_p, seed)
    steps = _new_ids(model, ids, max_new_tokens, temperature, top_k, top_p, seed, use_cache)
    return np.concatenate([ids, *(next_ids[:, None] for next_ids in steps)], axis=1)


def continuation(
    model: Model,
    prompt: np.ndarray,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    use_cache: bool = True,
) -> Iterator[np.ndarray]:
    """generate's new ids one step at a time, (B,) each, as soon as each is chosen (a caller
    shows each token before the next is computed). The arguments are checked here, before
    the first step."""
    ids = _checked_prompt(model, prompt, max_new_tokens, temperature, top_k, top_p, seed)
    return _new_ids(model, ids, max_new_tokens, temperature, top_k, top_p, seed, use_cache)


def _checked_prompt(model, prompt, max_new_tokens, temperature, top_k, top_p, seed) -> np.ndarray:
    """The prompt as (B, T0) ids, once every argument of generate is checked."""
    if not model.continues_prompt:
        raise InputError(f"generate continues a prompt; a {model.kind} model reads a source")
    check_sampling(temperature, top_k, top_p)
    checks.check_non_negative_int("seed", seed)
    _check_count("max_new_tokens", max_new_tokens, minimum=0)
    ids = checks.as_array("prompt", prompt)
    return checks.check_token_ids(
        "prompt", ids[None, :] if ids.ndim == 1 else ids, model.config.vocab_size
    )


def _new_ids(model, ids, max_new_tokens, temperature, top_k, top_p, seed, use_cache):
    """Yields each step's (B,) ids after the prompt ids (B, T0), as generate describes."""
    rng = np.random.default_rng(seed)
    decoder = model.decoder(ids, use_cache)
    eos = getattr(model.config, "eos_id", None)  # a config without one never stops early
    finished = np.zeros(ids.shape[0], dtype=bool)
    for step in range(max_new_tokens):
        next_ids = sample_next(decoder.next_logits(), rng, temperature, top_k, top_p)  # (B,)
        if eos is not None:
            next_ids = np.where(finished, eos, next_ids)  # a finished row repeats EOS
            finished |= next_ids == eos
        yield next_ids
        if step == max_new_tokens - 1 or finished.all():  # no logits needed after the last
            return
        decoder.append(next_ids)

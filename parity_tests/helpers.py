"""Shared test helpers: one call checks a layer pair against finite differences and torch;
the command line run in a process of its own, and its flags' help read from its parser."""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import subprocess
import sys
from typing import Callable, NamedTuple

import numpy as np
import pytest
import torch

from crosscheck.compare import (
    FLOAT64_ATOL,
    FLOAT64_RTOL,
    Float32Check,
    compare,
    float32_checks,
    float64_ok,
    sensitivities,
)
from crosscheck.rounding import model_golden
from numpy_engine import blocks, layers
from numpy_engine.gradcheck import check_directions, region_at, rounding_noise
from numpy_engine.layers import FFNCache


@contextlib.contextmanager
def folding_every_layernorm():
    """blocks.normed folds every layernorm into the projection it feeds, inside this context
    (its rule folds only at sizes far above the tests')."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blocks, "FOLD_ROWS", 0)
        patch.setattr(blocks, "FOLD_ENTRIES", 0)
        yield


def only_row_dots() -> dict:
    """A layers.FEW_ROW_PATHS whose every entry takes the row dots, whichever is faster."""
    return {rows: lambda x2, w, work: layers._row_dots(x2, w) for rows in layers.FEW_ROW_PATHS}


FD_TOLERANCE = 1e-6  # float64 central differences; we see ~1e-8 and below
DIRECTIONS_PER_TENSOR = 2  # random directions a tensor is checked along
WORST_ERRORS: dict[str, float] = {}  # check name -> worst error, printed after the run


COUNTS: dict[str, int] = {}  # event -> how often, printed after the run


def recorded_thread_settings(monkeypatch) -> dict[str, list]:
    """torch.set_num_threads, threadpoolctl.threadpool_limits and
    memory.keep_freed_memory replaced by recorders, for a benchmark's main:
    {"torch": [threads, ...], "blas": [threads, ...], "memory kept": [True, ...]}."""
    import threadpoolctl

    from numpy_engine import memory

    asked: dict[str, list] = {"torch": [], "blas": [], "memory kept": []}

    @contextlib.contextmanager
    def limits(n):
        asked["blas"].append(n)
        yield

    monkeypatch.setattr(memory, "keep_freed_memory", lambda: asked["memory kept"].append(True))
    monkeypatch.setattr(torch, "set_num_threads", asked["torch"].append)
    monkeypatch.setattr(threadpoolctl, "threadpool_limits", limits)
    return asked


def known_step_times(monkeypatch, calls: list, seconds: dict) -> None:
    """workloads.timed replaced: a step runs, and its side's k-th step 'takes' seconds[side][k],
    the side read from the (side, batch) that the step appended to calls."""
    from benchmarks import workloads

    def timed(fn, i):
        result = fn(i)
        side = calls[-1][0]
        return seconds[side][sum(name == side for name, _ in calls) - 1], result

    monkeypatch.setattr(workloads, "timed", timed)


def record_count(event: str) -> None:
    COUNTS[event] = COUNTS.get(event, 0) + 1


def record(name: str, error: float) -> None:
    """Keep the worst error seen by the check `name`, a NaN as inf (Python's max would keep
    whichever came first of it and a number)."""
    keep_worst(WORST_ERRORS, name, error)


def keep_worst(worst: dict[str, float], name: str, error: float) -> None:
    """worst[name] becomes the larger of itself and error, a NaN counting as inf."""
    worst[name] = max(math.inf if math.isnan(error) else error, worst.get(name, 0.0))


def assert_matches_finite_differences(
    name: str,
    forward: Callable[[dict], tuple],
    backward: Callable[[np.ndarray, object], dict],
    inputs: dict[str, np.ndarray],
    rng: np.random.Generator,
    region: Callable[[object], bytes | None] = lambda cache: None,
) -> None:
    """forward(inputs) -> (out, cache); backward(dout, cache) -> {input name: gradient}.

    The upstream gradient is random (never all ones), so every output entry is weighted
    differently: f = sum(out * dout), whose gradient the backward gives. region(cache), for
    a layer with ReLUs, names the smooth piece of f that the inputs lie on (relu_region).
    """
    out, cache = forward(inputs)
    dout = rng.standard_normal(np.shape(out))
    analytic = backward(dout, cache)

    def probe():
        out, cache = forward(inputs)
        return float(np.sum(out * dout)), region(cache)

    f_terms = float(np.sum(np.abs(out * dout)))  # f rounds with its terms
    assert_gradients_match_fd(name, probe, inputs, analytic, rng, f_terms)


def assert_gradients_match_fd(
    name: str,
    probe: Callable[[], "float | tuple[float, bytes]"],
    tensors: dict[str, np.ndarray],
    grads: dict[str, np.ndarray],
    rng: np.random.Generator,
    f_terms: float = 0.0,
) -> None:
    """Each tensor's gradient against central differences of probe, which reads the tensors
    (nudged in place), along DIRECTIONS_PER_TENSOR random directions: one difference weighs
    every entry at once, as PyTorch's gradcheck fast mode does. probe's rounding is measured
    once, along the tensor with the largest gradient, and its region once (a nudge restores
    the tensors bit for bit); f_terms as check_directions takes it."""
    assert grads.keys() == tensors.keys(), f"{name}: gradients for {sorted(grads)}"
    largest = max(grads, key=lambda key: np.linalg.norm(grads[key]))
    noise = rounding_noise(probe, tensors[largest], rng.standard_normal(grads[largest].shape))
    region = region_at(probe)  # the tensors' region as they are, restored after every nudge
    for key, x in tensors.items():
        assert grads[key].shape == x.shape, f"{name}: d{key} has shape {grads[key].shape}"
        directions = [rng.standard_normal(x.shape) for _ in range(DIRECTIONS_PER_TENSOR)]
        check = check_directions(
            probe,
            x,
            grads[key],
            directions,
            FD_TOLERANCE,
            f_terms=f_terms,
            noise=noise,
            region=region,
        )
        record(name, check.error)
        assert check.error < FD_TOLERANCE, (
            f"{name}: d{key} differs from finite differences, relative error {check.error:.3e}"
        )


def region_of(activation: str, relu_pattern: Callable[[object], bytes] | None = None):
    """What a probe reports as its region, from a forward's cache: for ReLUs, which inputs
    are positive (relu_pattern, by default relu_region); GELU is smooth: no region (None)."""
    if activation == "relu":
        return relu_pattern or relu_region
    return lambda cache: None


def relu_region(cache) -> bytes:
    """Which ReLU pre-activations in a forward cache are positive: the smooth piece of the
    loss that the inputs are on. A step that changes it crosses a kink. (A walk with a
    stack, not recursion: it runs on every probe, ~170 nested tuples a model's cache.)"""
    positive, stack = [], [cache]
    while stack:
        part = stack.pop()
        if isinstance(part, FFNCache):
            if part.activation == "relu":
                positive.append((part.act > 0).tobytes())
        elif isinstance(part, tuple | list):
            stack.extend(part)
    return b"".join(positive)


def random_visible(rng: np.random.Generator, shape: tuple, kind: str) -> np.ndarray | None:
    """A mask of the given kind for scores of shape (B, H, Tq, Tk), every row seeing a key."""
    B, H, Tq, Tk = shape
    if kind == "none":
        return None
    if kind == "causal":  # Tq == Tk here
        return np.tril(np.ones((Tq, Tk), dtype=bool))[None, None]
    if kind == "padding":
        visible = np.arange(Tk)[None, :] < rng.integers(1, Tk + 1, size=(B, 1))  # (B, Tk)
        return visible[:, None, None, :]
    if kind == "shared":  # one random (Tq, Tk) mask for every batch row and head, every
        visible = random_visible(rng, (1, 1, Tq, Tk), "random")  # query seeing the last key
        visible[..., -1] = True
        return visible
    visible = rng.random((B, H, Tq, Tk)) < 0.5  # "random"
    one_key_per_row = rng.integers(0, Tk, size=(B, H, Tq, 1))
    np.put_along_axis(visible, one_key_per_row, True, axis=-1)
    return visible


# --------------------------------------------------------------------- against torch


class LayerCase(NamedTuple):
    """One layer pair with its inputs, checked by finite differences and against torch."""

    name: str
    inputs: dict[str, np.ndarray]  # float64 arrays whose gradients are checked
    forward: Callable[[dict], tuple]  # engine: inputs -> (out, cache)
    backward: Callable[[np.ndarray, object], dict]  # engine: (dout, cache) -> {name: grad}
    torch_forward: Callable[[dict], torch.Tensor]  # torch: {name: tensor} -> out
    region: Callable[[object], bytes | None] = lambda cache: None  # ReLU's smooth piece


def check_layer(case: LayerCase, rng: np.random.Generator, float32: bool = True) -> None:
    """Both witnesses: central finite differences, then PyTorch autograd (float64, and float32
    unless the case's float32 values are rounding noise that no bound can judge)."""
    assert_matches_finite_differences(
        case.name, case.forward, case.backward, case.inputs, rng, case.region
    )
    assert_matches_torch(case, rng, float32)


def _keyed(out: np.ndarray, grads: dict) -> dict[str, np.ndarray]:
    """The output and every gradient, keyed as _torch_run keys them."""
    return {"output": out} | {f"d{key}": g for key, g in grads.items()}


def layer_outputs(case: LayerCase, inputs: dict, dout: np.ndarray) -> dict[str, np.ndarray]:
    out, cache = case.forward(inputs)
    return _keyed(out, case.backward(dout, cache))


def _engine_run(case: LayerCase, inputs: dict, dout: np.ndarray) -> dict[str, np.ndarray]:
    """layer_outputs, checking the backward's contract on the way."""
    out, cache = case.forward(inputs)
    grads = case.backward(dout, cache)
    for key, grad in grads.items():  # the contract: a backward returns fresh arrays
        shared = [name for name, x in {"dout": dout, **inputs}.items() if np.shares_memory(grad, x)]
        assert not shared, f"{case.name}: d{key} shares memory with {shared}"
    # and is pure: it leaves its cache as it was, so running it again gives the same bits
    again = case.backward(dout.copy(), cache)
    for key, grad in grads.items():
        np.testing.assert_array_equal(again[key], grad, err_msg=f"{case.name}: d{key}, again")
    return _keyed(out, grads)


def _torch_run(case: LayerCase, inputs: dict, dout: np.ndarray) -> dict[str, np.ndarray]:
    tensors = {key: torch.tensor(value, requires_grad=True) for key, value in inputs.items()}
    out = case.torch_forward(tensors)
    out.backward(torch.tensor(dout))
    grads = {f"d{key}": t.grad.numpy() for key, t in tensors.items()}
    return {"output": out.detach().numpy()} | grads


def assert_matches_torch(case: LayerCase, rng: np.random.Generator, float32: bool = True) -> None:
    out, _ = case.forward(case.inputs)
    dout = rng.standard_normal(np.shape(out))  # random, never all ones
    ours, golden = _engine_run(case, case.inputs, dout), _torch_run(case, case.inputs, dout)
    assert_all_close_float64(case.name, ours, golden)
    if float32:
        engine32, _ = layer_float32_checks(case, dout, rng)
        assert_float32_within_bound(case.name, engine32)


def layer_float32_checks(case: LayerCase, dout: np.ndarray, rng: np.random.Generator) -> tuple:
    """(the engine's, torch's) float32 checks of one case: each engine's float32 run against a
    float64 golden run on the same float32-rounded inputs, under one bound. The golden run is
    the float64 engine's: it equals torch's float64 within 1e-10, and where torch's float64
    loses digits (1 + tanh(u) deep in GELU's tail rounds to 0) it keeps them."""
    inputs32 = {key: value.astype(np.float32) for key, value in case.inputs.items()}
    dout32 = np.asarray(dout, dtype=np.float32)
    exact = {key: value.astype(np.float64) for key, value in inputs32.items()}
    exact["upstream"] = dout32.astype(np.float64)  # sensitivities moves the upstream too

    def engine64(i):  # run ~180 times per case by sensitivities: its contract checked once
        return layer_outputs(case, params_of(i, "upstream"), i["upstream"])

    # the float64 engine, checked against torch just before
    golden = _engine_run(case, params_of(exact, "upstream"), exact["upstream"])
    sensitivity = sensitivities(engine64, exact, rng)
    return (
        float32_checks(_engine_run(case, inputs32, dout32), golden, sensitivity),
        float32_checks(_torch_run(case, inputs32, dout32), golden, sensitivity),
    )


def params_of(inputs: dict, *not_params: str) -> dict:
    return {key: value for key, value in inputs.items() if key not in not_params}


def assert_all_close_float64(name: str, ours: dict, ref: dict) -> None:
    assert ours.keys() == ref.keys(), f"{name}: {sorted(ours)} vs {sorted(ref)}"
    scale = max(float(np.linalg.norm(value)) for value in ref.values())
    for key in ref:
        c = compare(f"{name}: {key}", ours[key], ref[key])
        # The summary's relative differences leave out tensors below 1e-3 of the case's
        # largest (e.g. everything behind a layernorm over 2 channels, whose gradient is
        # ~eps): there both engines agree to rounding of the case's scale, not of the tensor.
        # And tensors so small that the absolute term judges them (GELU's far tail, where
        # torch's float64 1 + tanh(u) rounds to 0 and the engine's keeps its digits).
        if c.ref_norm > 1e-3 * scale and FLOAT64_RTOL * c.ref_norm > FLOAT64_ATOL:
            record(f"torch float64 {name}", c.rel)
        assert float64_ok(c), c.describe()


def assert_float32_within_bound(name: str, checks: dict[str, Float32Check]) -> None:
    """Every tensor's float32 error within the bound of crosscheck/compare.py."""
    record(f"float32 error/bound {name}", max(c.ratio for c in checks.values()))
    for key, check in checks.items():
        assert check.ok, (
            f"{name}: {key} in float32 is {check.error:.3e} from the float64 golden run "
            f"(norm {check.golden_norm:.3e}), above the bound {check.bound:.3e} "
            f"(its sensitivity to float32 rounding of the inputs: {check.sensitivity:.3e}"
            + (f", its rounding spread: {check.spread:.3e})" if check.spread else ")")
        )


# ---------------------------------------------------------------------------- whole models


def engine_results(model, batch: tuple, dlogits: np.ndarray) -> dict[str, np.ndarray]:
    """Logits, loss, loss gradients, and gradients under a random upstream dlogits."""
    logits, cache = model.forward(*batch[:-1])
    upstream = model.backward(dlogits.astype(logits.dtype), cache)
    loss, grads = model.loss_and_grads(*batch)
    return (
        {"logits": logits, "loss": np.array(loss)}
        | {f"dloss/d{key}": g for key, g in grads.items()}
        | {f"dlogits-weighted d{key}": g for key, g in upstream.items()}
    )


def float32_golden(model, batch: tuple, dlogits: np.ndarray, rng) -> tuple:
    """(model in float32, dlogits in float32, the Golden run of crosscheck/rounding.py: a
    float64 run on the float32-rounded weights and upstream gradient, with each result's
    sensitivity and rounding spread): what float32_checks judges a float32 run by."""
    model32 = model.with_dtype("float32")
    dlogits32 = dlogits.astype(np.float32)

    def compute(exact, inputs: dict) -> dict:
        return engine_results(exact, batch, inputs["upstream"])

    upstream = {"upstream": dlogits32.astype(np.float64)}
    return model32, dlogits32, model_golden(model32, compute, rng, upstream)


def argument_helps(parser: argparse.ArgumentParser, command: str = "") -> dict[str, str]:
    """Each argument's help text, by command and name ("train --lr"), through every
    subcommand; --help, --version and arguments whose help is suppressed left out."""
    helps = {}
    for action in parser._actions:  # argparse keeps no public list of them
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                helps |= argument_helps(sub, f"{command} {name}".strip())
        elif action.help != argparse.SUPPRESS and not isinstance(
            action, argparse._HelpAction | argparse._VersionAction
        ):
            name = "/".join(action.option_strings) or action.dest
            helps[f"{command} {name}".strip()] = action.help or ""
    return helps


def unexplained(helps: dict[str, str]) -> dict[str, str]:
    """The arguments whose help says no more than a word besides its default: what --help
    must explain is what the argument is ("(default: 2)" alone says nothing of that)."""
    said = {name: re.sub(r"\(default[^)]*\)", "", text).split() for name, text in helps.items()}
    return {name: helps[name] for name, words in said.items() if len(words) < 2}


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m numpy_engine ARGS` in a process of its own, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "numpy_engine", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def info_lines(capsys, path) -> dict[str, str]:
    """`numpy-engine info --checkpoint PATH`'s lines, each text by its label ("run", ...)."""
    from numpy_engine.cli import main

    capsys.readouterr()
    assert main(["info", "--checkpoint", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    return {line[:10].strip(): line[11:] for line in lines}

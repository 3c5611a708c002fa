"""A training step's time by part, for where_time_goes.py: the engine's step with each layer
function timed (its own time, without the layer functions it calls), and its torch twin's
forward and backward under torch.profiler, each op's own time summed by kind, with clipping
and the optimizer timed without the profiler. Each part is in ms a step."""

from __future__ import annotations

import collections
import functools
import statistics
import sys
import time

from benchmarks import gpt2, workloads

ENGINE_PARTS = {  # part: functions timed, by module
    "linear": {
        "layers": ["linear_forward", "linear_backward", "_folded_forward", "_folded_backward"]
    },
    "attention": {"attention": ["attention_forward", "attention_backward"]},
    "heads": {"multihead": ["split_heads", "heads_buffer", "stacked", "unstacked"]},
    "layernorm": {
        "layernorm": [
            "layernorm_forward",
            "layernorm_backward",
            "normalize_forward",
            "normalize_backward",
        ]
    },
    "activation": {
        "activations": ["gelu_forward", "gelu_backward", "relu_forward", "relu_backward"]
    },
    "embedding": {
        "layers": [
            "embedding_forward",
            "embedding_backward",
            "embedding_row_grads",
            "learned_positions_forward",
            "learned_positions_backward",
            "sinusoidal_forward",
            "sinusoidal_backward",
        ]
    },
    "loss": {"losses": ["linear_cross_entropy", "cross_entropy_forward", "cross_entropy_backward"]},
}


class PartTimer:
    """Times wrapped functions, each part's own time (a wrapped callee's time is its own)."""

    def __init__(self) -> None:
        self.totals: collections.Counter = collections.Counter()
        self._stack: list[float] = []  # time spent in wrapped callees, per open call

    def wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            self._stack.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                inner = self._stack.pop()
                self.totals[part] += elapsed - inner
                if self._stack:
                    self._stack[-1] += elapsed

        return timed


def _instrument(timer: PartTimer) -> list:
    """Wrap every ENGINE_PARTS function wherever the engine's modules imported it, the
    activations' table, the flat gradient and the optimizer step; returns the calls that put
    each back."""
    import numpy_engine.models.base as base
    import numpy_engine.optim as optim
    from numpy_engine import activations, attention, layernorm, layers, losses, multihead

    sources = {
        "layers": layers,
        "layernorm": layernorm,
        "activations": activations,
        "attention": attention,
        "multihead": multihead,
        "losses": losses,
    }
    originals = {}
    for part, by_module in ENGINE_PARTS.items():
        for module_name, names in by_module.items():
            for name in names:
                originals[getattr(sources[module_name], name)] = part
    undo = []
    for module in [m for name, m in sys.modules.items() if name.startswith("numpy_engine")]:
        for name, value in list(vars(module).items()):
            if callable(value) and value in originals:
                undo.append(functools.partial(setattr, module, name, value))
                setattr(module, name, timer.wrap(originals[value], value))
    table = dict(activations.ACTIVATIONS)  # the activations are called through this table
    undo.append(functools.partial(activations.ACTIVATIONS.update, table))
    for key, pair in table.items():
        activations.ACTIVATIONS[key] = tuple(timer.wrap("activation", fn) for fn in pair)
    for owner, name, part in (
        (base.Model, "flat_grads", "flat gradient"),
        (optim.Optimizer, "step", "optimizer"),
    ):
        undo.append(functools.partial(setattr, owner, name, getattr(owner, name)))
        setattr(owner, name, timer.wrap(part, getattr(owner, name)))
    return undo


def engine_side(name: str, n_batches: int) -> tuple:
    """(model, optimizer, batches, step(model, optimizer, batch)) of a workload, or of gpt2
    as benchmarks/gpt2.py trains it (its flat gradient in one reused buffer)."""
    if name == gpt2.WORKLOAD:
        model = gpt2.engine_model()
        trainer = gpt2.EngineTrainer(model)
        return model, trainer.optimizer, gpt2.batches(n_batches), lambda m, o, b: trainer.step(b)
    model, optimizer, batches = workloads.build(workloads.WORKLOADS[name], n_batches)
    return model, optimizer, batches, workloads.engine_step


def engine_parts(name: str, steps: int) -> dict:
    """ms per step: the plain step, and each part's own time in an instrumented run."""
    model, optimizer, batches, step = engine_side(name, 2 * steps + 2)
    for batch in batches[:2]:
        step(model, optimizer, batch)
    plain = [_ms(step, model, optimizer, b) for b in batches[2:][:steps]]
    timer = PartTimer()
    undo = _instrument(timer)
    try:
        timed = sum(_ms(step, model, optimizer, b) for b in batches[2 + steps :])
    finally:
        for put_back in undo:
            put_back()
    parts = {part: 1e3 * total / steps for part, total in timer.totals.items()}
    parts["between layers"] = timed / steps - sum(parts.values())  # of the instrumented steps
    return {"step": statistics.median(plain), "instrumented": timed / steps, "parts": parts}


def _torch_side(name: str, n_batches: int) -> tuple:
    """(loss(*batch), parameters(), optimizer, batches) of the engine's twin: torch_reference,
    or for gpt2 transformers' GPT2LMHeadModel (benchmarks/gpt2.py)."""
    import torch

    if name == gpt2.WORKLOAD:
        trainer = gpt2.TorchTrainer(gpt2.engine_model())
        batches = [tuple(torch.from_numpy(x) for x in b) for b in gpt2.batches(n_batches)]

        def loss(idx, targets):
            logits = trainer.hf(idx).logits
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

        return loss, trainer.hf.parameters, trainer.optimizer, batches
    from benchmarks.bench import build
    from crosscheck.convert import tensor, torch_model_for

    model, _, batches, optimizer_class = build(workloads.WORKLOADS[name], n_batches)
    module = torch_model_for(model)
    optimizer = optimizer_class(module.parameters(), lr=1e-3)
    batches = [tuple(tensor(x) for x in batch) for batch in batches]
    return module.loss, module.parameters, optimizer, batches


def torch_parts(name: str, steps: int) -> dict:
    """The twin's step in ms alone; its forward and backward under torch.profiler, by kind
    of op (each op's own time); clipping and the optimizer timed without it."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    loss, parameters, optimizer, batches = _torch_side(name, 2 * steps + 2)
    parts: collections.Counter = collections.Counter()

    def step(batch, profiled: bool = False) -> None:
        optimizer.zero_grad(set_to_none=True)
        with record_function("forward and backward"):
            loss(*batch).backward()
        for part, run in (
            ("clipping", lambda: torch.nn.utils.clip_grad_norm_(parameters(), 1.0)),
            ("optimizer", optimizer.step),
        ):
            start = time.perf_counter()
            run()
            if profiled:
                parts[f"{part} (unprofiled)"] += 1e6 * (time.perf_counter() - start)  # us

    for batch in batches[:2]:
        step(batch)
    plain = [_ms(step, b) for b in batches[2:][:steps]]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches[2 + steps :]:
            step(batch, profiled=True)
    for event in prof.key_averages():
        parts[_torch_part(event.key)] += event.self_cpu_time_total  # us
    return {
        "step": statistics.median(plain),
        "parts": {p: us / 1e3 / steps for p, us in parts.items()},
    }


TORCH_PARTS = {  # part: aten ops (their own time)
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "dot"),
    "attention": (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_softmax",
        "_softmax_backward_data",
        "masked_fill_",
    ),
    "layernorm": ("native_layer_norm", "native_layer_norm_backward"),
    "activation": ("gelu", "gelu_backward", "relu", "threshold_backward"),
    "loss": ("_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward"),
    "embedding": ("embedding", "embedding_dense_backward", "index_select", "index_add_"),
}


def _torch_part(key: str) -> str:
    if key.startswith("aten::"):
        op = key.removeprefix("aten::")
        return next((part for part, ops in TORCH_PARTS.items() if op in ops), "other ops")
    if key.startswith("autograd::") or key.endswith("Backward0") or key.endswith("Backward1"):
        return "autograd"
    return "between ops (Python)"  # the region's own time: no op running


def _ms(fn, *args) -> float:
    return 1e3 * workloads.timed(fn, *args)[0]

"""`numpy-engine parity`: one padded batch through both engines, a table per parameter.

float64 rows pass when ||engine - torch|| <= 1e-12 + 1e-10 ||torch||. float32 rows compare
the engine's float32 run with a float64 golden run (the float64 engine) on the same float32
weights, and pass within the rounding bound of crosscheck.compare.
"""

from __future__ import annotations

import numpy as np

from crosscheck.compare import (
    FLOAT64_ATOL,
    FLOAT64_RTOL,
    compare,
    float32_checks,
    float64_ok,
)
from crosscheck.convert import grads_from_torch, tensor, torch_model_for
from crosscheck.rounding import model_golden
from numpy_engine.study import checkpoint_example, example_batch

ABSOLUTE_MARK = "*"


def results(model, batch) -> dict[str, np.ndarray]:
    logits, _ = model.forward(*batch[:-1])
    loss, grads = model.loss_and_grads(*batch)
    return {"logits": logits, "loss": np.array(loss)} | grads


def torch_results(module, batch) -> dict[str, np.ndarray]:
    inputs = [tensor(x) for x in batch]
    logits = module(*inputs[:-1])
    loss = module.loss(*inputs)
    loss.backward()
    scalars = {"logits": logits.detach().numpy(), "loss": loss.detach().numpy()}
    return scalars | grads_from_torch(module)


def float32_report_checks(model, batch, seed: int) -> tuple[dict, dict, dict]:
    """(engine float32 results, torch float32 results, the engine's checks)."""
    model32 = model.with_dtype("float32")
    rng = np.random.default_rng(seed)
    # the float64 engine on float32's weights, which agrees with torch's within 1e-10
    golden = model_golden(model32, lambda exact, _: results(exact, batch), rng)
    ours, ref = results(model32, batch), torch_results(torch_model_for(model32), batch)
    return ours, ref, float32_checks(ours, *golden)


def report(
    model_name: str, dtype: str, seed: int, checkpoint: str | None = None
) -> tuple[list[str], bool]:
    """The table's lines and whether every row passed: the default model of kind model_name,
    or, given checkpoint, the model it holds (model_name is then its kind)."""
    if checkpoint is None:
        model, batch = example_batch(model_name, seed)
    else:
        model, batch = checkpoint_example(checkpoint, seed)
        model_name = f"{checkpoint}: {model.kind}"
    if dtype == "float64":
        ours, ref, checks = (
            results(model, batch),
            torch_results(torch_model_for(model), batch),
            None,
        )
    else:
        ours, ref, checks = float32_report_checks(model, batch, seed)
    header = f"{'tensor':<36} {'shape':<12} {'max |diff|':>10} {'rel diff':>10}"
    header += "  result" if checks is None else f" {'err vs f64':>10} {'bound':>10}  result"
    lines, all_ok, absolute_rows = [header, "-" * len(header)], True, 0
    for key in ref:
        c = compare(key, ours[key], ref[key])
        ok = float64_ok(c) if checks is None else checks[key].ok
        all_ok &= ok
        # where ||torch|| is ~0 (a key bias: softmax ignores a shift shared by all keys), the
        # relative difference divides rounding by rounding; the absolute term decides
        absolute = checks is None and c.diff_norm > FLOAT64_RTOL * c.ref_norm
        absolute_rows += absolute
        rel = f"{c.rel:>9.2e}{ABSOLUTE_MARK if absolute else ' '}"
        line = f"{key:<36} {str(c.shape):<12} {c.max_abs:>10.2e} {rel:>10}"
        if checks is not None:
            line += f" {checks[key].error:>10.2e} {checks[key].bound:>10.2e}"
        lines.append(line + ("  pass" if ok else "  FAIL"))
    failed = sum(line.endswith("FAIL") for line in lines)
    lines.append(
        f"{len(ref)} tensors compared, {failed} failed ({model_name}, {dtype}, seed {seed})"
    )
    if absolute_rows:
        lines.append(
            f"{ABSOLUTE_MARK} true value ~0 (a key bias's gradient is exactly 0: softmax ignores "
            f"a shift shared by all keys), so the relative difference is rounding over rounding; "
            f"judged by the absolute bound {FLOAT64_ATOL:g}"
        )
    return lines, all_ok

"""`numpy-engine parity`: one padded batch through both engines, a table per parameter.

float64 rows pass when ||engine - torch|| <= 1e-12 + 1e-10 ||torch||. float32 rows
compare the engine's float32 run with torch's float32 run, and pass when the engine's
error against a float64 golden run is within the bound of torch_reference.compare.
"""

from __future__ import annotations

import numpy as np

from numpy_engine.study import example_batch
from torch_reference.compare import compare, float32_checks, float64_ok
from torch_reference.convert import grads_from_torch, tensor, torch_model_for


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


def report(model_name: str, dtype: str, seed: int) -> tuple[list[str], bool]:
    """The table's lines and whether every row passed."""
    model, batch = example_batch(model_name, seed)
    golden = torch_results(torch_model_for(model), batch)
    if dtype == "float64":
        ours, ref, checks = results(model, batch), golden, None
    else:
        model32 = model.with_dtype("float32")
        ours, ref = results(model32, batch), torch_results(torch_model_for(model32), batch)
        checks = float32_checks(ours, ref, golden)
    header = f"{'tensor':<36} {'shape':<12} {'max |diff|':>10} {'rel diff':>10}"
    header += "  result" if checks is None else f" {'err vs f64':>10} {'bound':>10}  result"
    lines, all_ok = [header, "-" * len(header)], True
    for key in ref:
        c = compare(key, ours[key], ref[key])
        ok = float64_ok(c) if checks is None else checks[key].ok
        all_ok &= ok
        line = f"{key:<36} {str(c.shape):<12} {c.max_abs:>10.2e} {c.rel:>10.2e}"
        if checks is not None:
            line += f" {checks[key].engine_error:>10.2e} {checks[key].bound:>10.2e}"
        lines.append(line + ("  pass" if ok else "  FAIL"))
    failed = sum(line.endswith("FAIL") for line in lines)
    lines.append(
        f"{len(ref)} tensors compared, {failed} failed ({model_name}, {dtype}, seed {seed})"
    )
    return lines, all_ok

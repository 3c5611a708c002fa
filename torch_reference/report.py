"""`numpy-engine parity`: one padded batch through both engines, a table per parameter.

float64 rows pass when ||engine - torch|| <= 1e-12 + 1e-10 ||torch||. float32 rows
compare the engine's float32 run with torch's float32 run, and pass when the engine's
error against a float64 golden run is within the bound of torch_reference.compare.
"""

from __future__ import annotations

import numpy as np

import numpy_engine as ne
from torch_reference.compare import compare, float32_checks, float64_ok
from torch_reference.convert import grads_from_torch, tensor, torch_model_for


def build(model_name: str, seed: int):
    """The default model of that kind in float64 and one padded batch, all from seed."""
    rng = np.random.default_rng(seed)
    if model_name == "seq2seq":
        model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(dtype="float64"), seed=seed)
        lengths = np.array([3, 2, 1, 3])
        tokens = rng.integers(4, 12, size=(4, 3)) * (np.arange(3) < lengths[:, None])  # (B, 3)
        source = tokens
        decoder_input = np.concatenate([np.ones((4, 1), dtype=int), tokens], axis=1)  # BOS + tokens
        target = np.concatenate([tokens, np.zeros((4, 1), dtype=int)], axis=1)
        target[np.arange(4), lengths] = 2  # EOS after the last token, then padding
        return model, (source, decoder_input, target)
    model = ne.MiniGPT(ne.GPTConfig(dtype="float64"), seed=seed)
    idx = rng.integers(0, 13, size=(4, 32))
    targets = np.roll(idx, -1, axis=1)
    targets[:, -1] = -100
    targets[1, 20:] = -100  # a padded row
    return model, (idx, targets)


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
    model, batch = build(model_name, seed)
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

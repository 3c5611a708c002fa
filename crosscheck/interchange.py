"""`numpy-engine export` / `import`: engine checkpoints to and from PyTorch state_dicts.

export writes model.pt, a plain state_dict that torch_reference loads with
torch.load(..., weights_only=True) and load_state_dict(strict=True), and beside it
model.pt.json with the model kind, config and what generation needs (task, vocabulary).
import reads both back, with torch's weights-only unpickler: anything that is not
tensors in a dict is refused.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.checks import InputError
from numpy_engine.models import model_class

KEPT_META = ("task", "vocabulary")


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def export_checkpoint(checkpoint_path: str | Path, to: str | Path) -> Path:
    checkpoint = load_checkpoint(checkpoint_path, optimizer=False)
    model, to = checkpoint.model, Path(to)
    state_dict = {key: torch.tensor(value) for key, value in model.params.items()}
    try:
        to.parent.mkdir(parents=True, exist_ok=True)  # as the engine's own writers do
        torch.save(state_dict, to)
    except (OSError, RuntimeError) as error:  # torch.save's failure to open is a RuntimeError
        raise InputError(f"--to {to}: cannot write it ({error})") from None
    meta = {key: value for key, value in checkpoint.meta.items() if key in KEPT_META}
    description = {"kind": model.kind, "config": dataclasses.asdict(model.config), "meta": meta}
    sidecar(to).write_text(json.dumps(description, indent=2) + "\n")
    return to


def import_state_dict(path: str | Path, out: str | Path, config_path: str | Path | None = None):
    path = Path(path)
    config_path = Path(config_path) if config_path else sidecar(path)
    try:
        state_dict = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except Exception:  # any: the unpickler raises what the bytes lead to (KeyError on text)
        raise InputError(
            f"{path}: refused: it is not a weights-only file (it holds objects that loading "
            "would have to construct, or it is not a torch file at all)"
        ) from None
    if not isinstance(state_dict, dict) or not all(
        isinstance(v, torch.Tensor) for v in state_dict.values()
    ):
        raise InputError(f"{path}: refused, expected a dict of tensors (a state_dict)")
    description = _read_description(config_path)
    try:
        kind = model_class(description["kind"])
        config = kind.config_class(**description["config"])
    except (TypeError, ValueError) as error:
        raise InputError(f"{config_path}: cannot read the model description ({error})") from None
    params = {key: np.array(t.detach().numpy()) for key, t in state_dict.items()}
    model = kind.with_params(config, params)
    return save_checkpoint(out, model, None, description["meta"])


def _read_description(config_path: Path) -> dict:
    """What export wrote beside the .pt: the model's kind (a name), its config and the meta
    (JSON objects; a description without meta has none)."""
    try:
        description = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"{config_path}: cannot read the model description ({error})") from None
    if not isinstance(description, dict):
        problem = f"a JSON {type(description).__name__}, not an object"
    elif not isinstance(description.get("kind"), str):
        problem = 'no "kind" that names a model kind'
    elif not isinstance(description.get("config"), dict):
        problem = 'no "config" object'
    elif not isinstance(description.get("meta", {}), dict):
        problem = '"meta" is not a JSON object'
    else:
        return {"meta": {}} | description
    raise InputError(f"{config_path}: cannot read the model description ({problem})")

"""`info`: what a checkpoint holds, read from its header alone (registered by cli.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import TYPE_CHECKING

from numpy_engine.cli_args import add_checkpoint_argument

if TYPE_CHECKING:
    from numpy_engine.checkpoint import Contents

SHOWN_CHARACTERS = 80  # a character vocabulary longer than this is shown cut, with its count


def add_info_command(commands) -> None:
    info = commands.add_parser(
        "info",
        help="what a checkpoint holds: its model, tokenizer, run and optimizer state",
        description="Print a checkpoint's model kind, size and config, the text it reads "
        "(characters, or the Hugging Face tokenizer it was imported with), the run that "
        "wrote it (its settings, step and last losses) and whether it can be resumed. Only "
        "the file's header and its arrays' shapes are read, so a 124M GPT-2 takes no longer "
        "than a small model.",
    )
    add_checkpoint_argument(info)
    info.set_defaults(run=run_info)


def run_info(args: argparse.Namespace) -> int:
    from numpy_engine.checkpoint import read_contents

    contents = read_contents(args.checkpoint)
    for label, text in info_lines(contents):
        print(f"{label:<10} {text}")
    return 0


def info_lines(contents: Contents) -> list[tuple[str, str]]:
    """(label, text) pairs, one per line of `info`."""
    megabytes = contents.path.stat().st_size / 1e6
    return [
        ("file", f"{contents.path} ({megabytes:,.1f} MB)"),
        ("model", _model(contents)),
        ("config", _config(contents.config)),
        ("text", _text(contents.meta)),
        ("run", _run(contents)),
        ("optimizer", _optimizer(contents)),
    ]


def _model(contents: Contents) -> str:
    count = sum(math.prod(shape) for shape, _ in contents.params.values())
    dtypes = sorted({str(dtype) for _, dtype in contents.params.values()})
    kind = f"{contents.model_class.kind} ({contents.model_class.__name__})"
    return f"{kind}, {'/'.join(dtypes)}, {count:,} parameters in {len(contents.params)} arrays"


def _config(config: object) -> str:
    fields = dataclasses.asdict(config)
    fields.pop("dtype", None)  # on the model line, as the arrays hold it
    return " ".join(f"{key}={value}" for key, value in fields.items())


def _text(meta: dict) -> str:
    if "tokenizer" in meta:
        ids = _tokenizer_ids(meta["tokenizer"])
        count = "" if ids is None else f", {ids:,} ids"
        return f"the Hugging Face tokenizer (tokenizer.json{count}) it was imported with"
    if "vocabulary" in meta:
        chars = meta["vocabulary"]
        shown = chars if len(chars) <= SHOWN_CHARACTERS else chars[:SHOWN_CHARACTERS] + "..."
        return f"{len(chars)} characters: {shown!r}"
    if meta.get("task") in ("copy", "reverse"):
        return "sequences of symbol ids (generate --source)"
    return "none: it keeps no tokenizer or vocabulary"


def _tokenizer_ids(tokenizer_json: str) -> int | None:
    """How many ids a tokenizer.json gives out (its model's vocabulary and its added tokens),
    read from the JSON without the tokenizers library; None for a layout not known here."""
    try:
        tokenizer = json.loads(tokenizer_json)
        vocab = tokenizer["model"]["vocab"]  # BPE and WordPiece: token -> id; Unigram: a list
        ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
        return len(ids | {token["id"] for token in tokenizer.get("added_tokens", [])})
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _run(contents: Contents) -> str:
    from numpy_engine.checks import InputError
    from numpy_engine.saved_runs import saved_config

    meta = contents.meta
    if not {"task", "train_config", "step"} <= meta.keys():
        return _no_run(meta)
    try:  # the saved settings, with those added since
        cfg = dataclasses.asdict(saved_config(contents.path.parent, meta))
    except InputError as error:
        return f"not readable here: {error}"
    history = meta.get("history", {})
    start = f"from {cfg['init']}" if cfg.get("init") else "from scratch"
    parts = [
        f"{meta['task']} {start}, step {meta['step']} of {cfg['steps']}",
        f"seed {cfg['seed']}, lr {cfg['lr']:g}{_schedule(cfg)}, batch {cfg['batch_size']}",
    ]
    if history.get("train_loss"):
        parts.append(f"last training loss {history['train_loss'][-1]:.4f}")
    if history.get("eval"):
        last = history["eval"][-1]
        measured = ", ".join(f"{k} {v:.4g}" for k, v in last.items() if k != "step")
        parts.append(f"at step {last['step']}: {measured}")
    return "; ".join(parts)


def _no_run(meta: dict) -> str:
    """What a checkpoint that records no run's settings came from, as far as its meta says."""
    if "source" in meta:  # import-hf's
        return f"none: imported from {meta['source']}"
    if "heldout_loss" in meta:  # train --keep-best's
        loss = meta["heldout_loss"]
        return f"none: a run's best weights, kept at step {meta['step']} (held-out loss {loss:.4f})"
    return "none recorded" + (f" (task {meta['task']})" if "task" in meta else "")


def _schedule(cfg: dict) -> str:
    """The lr's schedule, after the lr, where it is not constant (the copy tasks have none)."""
    schedule = cfg.get("schedule", "constant")
    return "" if schedule == "constant" else f" ({schedule}, warmup {cfg.get('warmup', 0)})"


def _optimizer(contents: Contents) -> str:
    from numpy_engine.checkpoint import FILENAME
    from numpy_engine.saved_runs import RUN_STATE_KEYS

    if not contents.optimizer_arrays:
        if contents.model_class.continues_prompt:  # a language model: fine-tuned by --init
            return "none saved: the weights alone (train lm --init starts a run from them)"
        return "none saved: the weights alone"
    saved = f"state saved ({contents.optimizer_arrays} arrays)"
    if contents.path.name == FILENAME and RUN_STATE_KEYS <= contents.meta.keys():
        return f"{saved}: train --resume {contents.path.parent} continues the run"
    return saved

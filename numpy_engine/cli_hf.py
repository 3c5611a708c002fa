"""`import-hf` and `export-hf`: Hugging Face GPT-2 directories in and out (registered by
cli.py; the work is in hf.py)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from numpy_engine.cli_args import (
    add_checkpoint_argument,
    path_name,
    refuse_a_file,
    refuse_an_existing_checkpoint,
    refuse_to_overwrite,
)


def add_hf_commands(commands) -> None:
    imp = commands.add_parser(
        "import-hf",
        help="turn a Hugging Face GPT-2 directory into an engine checkpoint (needs the hf extra)",
        description="Read config.json, model.safetensors (or the shards that "
        "model.safetensors.index.json lists, as save_pretrained writes a model past its "
        "max_shard_size) and (if present) tokenizer.json from "
        "DIR, as save_pretrained writes them or the hub's download gives them, and write "
        "RUN/checkpoint.npz: the weights (Conv1D weights transposed, c_attn split into q, k, "
        "v), the config, and the tokenizer for generate --prompt and train lm --text. "
        "A missing or unexpected key, a wrong shape or a model_type other than gpt2 is refused.",
    )
    imp.add_argument(
        "directory", type=path_name, metavar="DIR", help="the Hugging Face model directory"
    )
    imp.add_argument(
        "--out", required=True, type=path_name, metavar="RUN", help="where checkpoint.npz goes"
    )
    imp.set_defaults(run=run_import)

    exp = commands.add_parser(
        "export-hf",
        help="write a GPT-2 checkpoint as a Hugging Face directory (needs the hf extra)",
        description="Write config.json, model.safetensors and (if the checkpoint has one) "
        "tokenizer.json into DIR, which GPT2LMHeadModel.from_pretrained(DIR) loads.",
    )
    add_checkpoint_argument(exp)
    exp.add_argument(
        "--to", required=True, type=path_name, metavar="DIR", help="the directory to write"
    )
    exp.set_defaults(run=run_export)


def run_import(args: argparse.Namespace) -> int:
    from numpy_engine.hf import import_hf

    refuse_an_existing_checkpoint("--out", args.out)
    print(f"wrote {import_hf(args.directory, args.out)}")
    if not (Path(args.directory) / "tokenizer.json").is_file():
        print(_no_tokenizer_note(args.directory), file=sys.stderr)
    return 0


def _no_tokenizer_note(directory: str) -> str:
    """What a checkpoint imported without tokenizer.json cannot do, and, for a directory with
    the older vocab.json and merges.txt instead, the transformers line that writes one."""
    note = (
        f"note: {directory} has no tokenizer.json, so the checkpoint reads no text "
        "(generate --prompt, train lm --text) until it is imported with one"
    )
    if all((Path(directory) / name).is_file() for name in ("vocab.json", "merges.txt")):
        note += (
            ". It has vocab.json and merges.txt, from which transformers writes tokenizer.json "
            f"beside them:\n    {tokenizer_json_command(directory)}\nthen run import-hf again"
        )
    return note


def tokenizer_json_command(directory: str) -> str:
    """A shell line that makes transformers write tokenizer.json into a GPT-2 directory."""
    name = json.dumps(str(directory))  # a Python string literal, in double quotes
    code = f"d = {name}; from transformers import AutoTokenizer as T; "
    code += "T.from_pretrained(d).save_pretrained(d)"
    return f"python -c {shlex.quote(code)}"


def run_export(args: argparse.Namespace) -> int:
    from numpy_engine.hf import HF_FILES, export_hf

    refuse_a_file("--to", args.to)
    written = [os.path.join(args.to, name) for name in HF_FILES]
    refuse_to_overwrite("--to", args.to, written, "give a new directory")
    print(f"wrote {export_hf(args.checkpoint, args.to)}")
    if not (Path(args.to) / "tokenizer.json").is_file():  # a character vocabulary has no file
        print(
            f"note: the checkpoint keeps no Hugging Face tokenizer, so {args.to} has no "
            "tokenizer.json: the model's ids are its own (a character vocabulary, or none)",
            file=sys.stderr,
        )
    return 0

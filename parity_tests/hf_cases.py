"""What the Hugging Face tests share: a random transformers GPT-2 with a trained byte-level
BPE tokenizer, written as save_pretrained writes it (conftest's hf_dir), a copy of it
spoiled as a test asks, and the command line run in this process."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel

from numpy_engine.cli import main
from numpy_engine.tasks import DEFAULT_TEXT

EOT = "<|endoftext|>"


def bpe_tokenizer(text: str) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([text], trainer)
    return tokenizer


def save_random_gpt2(directory: Path) -> Path:
    """A random 2-layer transformers GPT-2 and its BPE tokenizer, written into directory."""
    tokenizer = bpe_tokenizer(DEFAULT_TEXT)
    eot = tokenizer.token_to_id(EOT)
    config = GPT2Config(
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=2,
        bos_token_id=eot,
        eos_token_id=eot,
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).eval().save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def spoiled(tmp_path, hf_dir, config=None, state=None):
    """A copy of hf_dir with config.json and the weights changed as given."""
    out = tmp_path / "spoiled"
    out.mkdir()
    hf_config = json.loads((hf_dir / "config.json").read_text()) | (config or {})
    (out / "config.json").write_text(json.dumps(hf_config))
    weights = load_file(hf_dir / "model.safetensors")
    save_file(state(weights) if state else weights, out / "model.safetensors")
    return out

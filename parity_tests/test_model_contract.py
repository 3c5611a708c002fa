"""A new model kind is one module plus its registration: this file is that module for a tiny
bigram language model, registered for the length of these tests, and shows it train,
checkpoint, resume and decode through the public API and through the command line's code.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pytest

from numpy_engine import checks, train
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.cli import main
from numpy_engine.configs import REFERENCE_RUNS, CharTrainConfig
from numpy_engine.generate import generate
from numpy_engine.keys import with_prefix
from numpy_engine.layers import (
    embedding_backward,
    embedding_forward,
    linear_backward,
    linear_forward,
)
from numpy_engine.models import IGNORE_INDEX, KINDS, Model, register
from numpy_engine.models.base import RerunDecoder
from numpy_engine.tasks import DEFAULT_TEXT

# ------------------------------------------------------------------ the new kind's module


@dataclass(frozen=True)
class BigramConfig:
    vocab_size: int = 13
    d_model: int = 8
    max_len: int = 16
    dtype: str = "float32"


class BigramCache(NamedTuple):
    embed: tuple
    head: tuple
    logits_shape: tuple  # Model.backward checks dlogits against it


class Bigram(Model):
    """logits[t] = head(embed[idx[t]]): the next token from this one alone."""

    kind = "bigram"
    config_class = BigramConfig
    torch_twin = None  # no PyTorch twin
    continues_prompt = True

    @staticmethod
    def _init_params(cfg, rng):
        V, C = cfg.vocab_size, cfg.d_model
        return {
            "embed.weight": rng.normal(0, 1, (V, C)),
            "head.weight": rng.normal(0, 0.2, (V, C)),
            "head.bias": np.zeros(V),
        }

    def forward(self, idx):
        idx = checks.check_token_ids("idx", idx, self.config.vocab_size)
        x, embed = embedding_forward(idx, self.params["embed.weight"])  # (B, T, C)
        logits, head = linear_forward(x, self.params["head.weight"], self.params["head.bias"])
        return logits, BigramCache(embed, head, logits.shape)

    def _backward(self, dlogits, cache):
        embed, head, _ = cache
        dx, head_grads = linear_backward(dlogits, head)
        _, embed_grads = embedding_backward(dx, embed)
        return with_prefix(embed_grads, "embed.") | with_prefix(head_grads, "head.")

    def loss_and_grads(self, idx, targets):
        return self._loss_and_grads((idx,), targets)

    def loss(self, idx, targets):
        return self._loss((idx,), targets)

    def ignore_index(self):
        return IGNORE_INDEX

    def _targets(self, targets, logits):
        vocab = self.config.vocab_size
        return checks.check_targets(
            "targets", targets, logits.shape[:2], vocab, IGNORE_INDEX, like="idx"
        )

    def decoder(self, prompt, use_cache=True):
        return RerunDecoder(self, prompt)  # nothing to cache

    def attention_panels(self, ids, labels):
        return []

    @staticmethod
    def example_batch(cfg, rng, batch_size, length=None):
        idx = rng.integers(0, cfg.vocab_size, (batch_size, length or cfg.max_len))
        return idx, np.roll(idx, -1, axis=1)

    @staticmethod
    def forward_flops(cfg, batch_size, length):
        return 2 * batch_size * length * cfg.d_model * cfg.vocab_size

    @staticmethod
    def step_values(cfg, batch_size, length):
        return batch_size * length * (2 * cfg.d_model + 4 * cfg.vocab_size)


# ------------------------------------------------------------------------------ the tests

TASK = CharTrainConfig(steps=30, lr=0.05, batch_size=16, context=16, model="bigram", task="bigram")


@pytest.fixture
def bigram_registered(monkeypatch):
    register(Bigram)
    monkeypatch.setitem(REFERENCE_RUNS, "bigram", TASK)
    yield
    del KINDS["bigram"]


def test_the_new_kind_trains_checkpoints_resumes_and_decodes(tmp_path, bigram_registered):
    first = train.run_task(dataclasses.replace(TASK, steps=15), progress_stream=None)
    train.save_run(first, tmp_path)
    resumed = train.resume(tmp_path, progress_stream=None, steps=30)
    whole = train.run_task(TASK, progress_stream=None)
    np.testing.assert_array_equal(resumed.model.flat, whole.model.flat)  # bit for bit
    assert whole.result["final_train_loss"] < whole.result["initial_train_loss"] - 0.5
    checkpoint = load_checkpoint(tmp_path)
    assert type(checkpoint.model) is Bigram and checkpoint.meta["task"] == "bigram"
    out = generate(checkpoint.model, np.array([[1, 2]]), max_new_tokens=5)
    assert out.shape == (1, 7) and out.max() < Bigram.config_class().vocab_size


def test_the_new_kind_goes_through_the_command_line(tmp_path, capsys, bigram_registered):
    out = str(tmp_path / "run")
    assert main(["train", "bigram", "--steps", "15", "--out", out, "--quiet"]) == 0
    assert main(["train", "--resume", out, "--steps", "30", "--quiet"]) == 0
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["task"] == "bigram" and result["steps"] == 30
    assert result["final_train_loss"] < result["initial_train_loss"] - 0.5
    capsys.readouterr()
    assert main(["generate", "--checkpoint", out, "--prompt", "to ", "--max-new-tokens", "9"]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    assert len(text) == 12 and set(text) <= set(DEFAULT_TEXT), text
    assert main(["grads", "--model", "bigram", "--entries", "2"]) == 0
    assert "bigram, seed 0: loss" in capsys.readouterr().out
    assert main(["export-hf", "--checkpoint", out, "--to", str(tmp_path / "hf")]) == 2
    refusal = capsys.readouterr().err.strip().splitlines()[-1]  # no PyTorch twin: no `export`
    assert refusal.endswith("this checkpoint holds a Bigram (kind 'bigram')"), refusal


def test_a_kind_name_is_registered_once():
    class Impostor(Bigram):
        kind = "gpt"

    with pytest.raises(ValueError, match="'gpt' is already registered"):
        register(Impostor)
    assert KINDS["gpt"].__name__ == "MiniGPT"

"""The example scripts run from top to bottom and reach what their docstrings promise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("name, at_least", [("train_copy.py", 0.97), ("train_reverse.py", 0.9)])
def test_sequence_examples_learn(name, at_least):
    out = run_example(name)
    exact_match = float(re.search(r"held-out exact match: ([0-9.]+)", out).group(1))
    assert exact_match >= at_least, out


def test_char_lm_example_learns():
    out = run_example("train_char_lm.py")
    last_loss = float(re.findall(r"step  300  loss ([0-9.]+)", out)[-1])
    assert last_loss < 0.6 and "greedy: 'to be" in out, out


def test_gpt2_example_fine_tunes_offline_and_from_a_directory(tmp_path):
    out = run_example("finetune_gpt2.py")
    losses = [float(x) for x in re.findall(r"step +\d+  loss ([0-9.]+)", out)]
    assert losses[-1] < 0.5 * losses[0] and "greedy: 'to be" in out, out
    before, after = (float(x) for x in re.findall(r"held-out loss \w+: ([0-9.]+)", out))
    assert after < 0.5 * before, out  # on the text's last tenth, which it never trained on

    from transformers import GPT2Config, GPT2LMHeadModel

    from parity_tests.test_hf_interchange import DEFAULT_TEXT, bpe_tokenizer

    tokenizer = bpe_tokenizer(DEFAULT_TEXT)
    config = GPT2Config(
        vocab_size=tokenizer.get_vocab_size(), n_positions=32, n_embd=16, n_layer=1, n_head=2
    )
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "finetune_gpt2.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    losses = [float(x) for x in re.findall(r"step +\d+  loss ([0-9.]+)", result.stdout)]
    assert len(losses) == 6 and losses[-1] < losses[0], result.stdout
    before, after = re.findall(r"held-out loss \w+: ([0-9.]+)", result.stdout)
    assert float(after) < float(before), result.stdout

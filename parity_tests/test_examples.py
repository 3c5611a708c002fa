"""The example scripts run from top to bottom and reach what their docstrings promise."""

from __future__ import annotations

import importlib.util
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

    from numpy_engine.tasks import DEFAULT_TEXT
    from parity_tests.hf_cases import bpe_tokenizer

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


def test_gpt2_example_explains_its_arguments_and_names_a_bad_one(tmp_path):
    """--help was read as the directory's name, and a missing directory or a text too short
    was a traceback."""
    script = [sys.executable, str(EXAMPLES / "finetune_gpt2.py")]
    shown = subprocess.run([*script, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "GPT2_DIR    a Hugging Face GPT-2 directory" in shown.stdout
    (tmp_path / "short.txt").write_text("ab")
    for args, said in [
        ([str(tmp_path / "none")], f"{tmp_path / 'none'}: no such directory"),
        (["", str(tmp_path / "short.txt")], "holdout=0.1 leaves the held-out part 0 of"),  # offline
    ]:
        refused = subprocess.run([*script, *args], capture_output=True, text=True, timeout=60)
        last = refused.stderr.strip().splitlines()[-1]
        assert refused.returncode == 2 and last.startswith(f"finetune_gpt2.py: error: {said}"), (
            refused.stderr
        )


def own_layer_errors(out: str) -> list[dict[str, float]]:
    """your_own_layer.py's printed errors, one {name: error} per numbered part."""
    parts = re.split(r"^\d\. ", out, flags=re.M)[1:]
    return [
        {k: float(v) for k, v in re.findall(r"^   (\w+): ([0-9.e+-]+)", p, re.M)} for p in parts
    ]


def test_own_layer_example_checks_its_backward_and_catches_a_broken_one():
    fd, torch_check, broken = own_layer_errors(run_example("your_own_layer.py"))
    assert fd.keys() == {"dx", "dweight"} and max(fd.values()) < 1e-6, fd
    assert torch_check.keys() == {"out", "dx", "dweight"}, torch_check
    assert max(torch_check.values()) < 1e-10, torch_check
    assert broken["dx"] > 1e-2, broken


def test_own_layer_example_fails_when_its_backward_is_wrong(monkeypatch, capsys):
    """Its exit code is the check: with the backward that drops r's path in place of the
    right one, parts 1 and 2 fail and main() returns 1."""
    spec = importlib.util.spec_from_file_location("your_own_layer", EXAMPLES / "your_own_layer.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.setattr(example, "rmsnorm_backward", example.rmsnorm_backward_without_r_path)
    assert example.main() == 1
    fd, torch_check, _ = own_layer_errors(capsys.readouterr().out)
    assert fd["dx"] > 1e-2 and torch_check["dx"] > 1e-2, (fd, torch_check)

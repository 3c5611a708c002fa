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

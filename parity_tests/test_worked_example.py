"""docs/gradients.md's worked example quotes one backward step of the copy model in numbers
(`numpy-engine grads --model seq2seq --seed 0`). A learner checks them against the command,
so each quoted number must be what the code computes now: a change to the model or to a
backward that moves one makes this test fail until the page is redrawn.

Only values are checked, to the 4-6 digits quoted: each lies at least 1e-7 (relative) from
where its last quoted digit would round the other way, against float64's 1e-16, so no
machine's order of additions moves one. Not the finite-difference errors the page also
quotes: those are roundings of differences of the loss, which that order does move."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from numpy_engine import study

PAGE = Path(__file__).resolve().parents[1] / "docs" / "gradients.md"


def worked_example() -> str:
    """The section's text with each run of whitespace as one space (lines wrap anywhere)."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("## Worked example")
    end = text.index("\n## ", start + 1)
    return re.sub(r"\s+", " ", text[start:end])


def row(values) -> str:
    return "[" + " ".join(f"{value:.4f}" for value in values) + "]"


def test_the_worked_example_quotes_what_the_code_computes():
    text = worked_example()
    model, (source, decoder_input, target) = study.example_batch("seq2seq", 0)
    loss, grads = model.loss_and_grads(source, decoder_input, target)
    logits, _ = model.forward(source, decoder_input)
    z = logits[0, 0]
    e = np.exp(z - z.max())
    softmax = e / e.sum()
    counted = int((target != model.config.pad_id).sum())
    dz = (softmax - np.eye(len(z))[target[0, 0]]) / counted  # (softmax - onehot) / M
    norm = {key: float(np.linalg.norm(g)) for key, g in grads.items()}
    embed_rows = np.linalg.norm(grads["embed.weight"], axis=1)
    quoted = [
        f"so `M = {counted}`",
        f"loss is **{loss:.6f}**",
        row(softmax),
        f"`dz = (softmax - onehot({target[0, 0]})) / {counted}`",
        row(dz),
        f"its norm, **{norm['readout.bias']:.3e}**",
        f"`readout.weight` has the largest gradient of the model, {norm['readout.weight']:.3f}",
        f"row 1 (BOS, used only by the decoder) gets norm {embed_rows[1]:.4f}",
    ]
    missing = [phrase for phrase in quoted if phrase not in text]
    assert not missing, f"docs/gradients.md's worked example does not say: {missing}"
    assert max(norm, key=norm.get) == "readout.weight"
    # "has norm **0**", "row 0 (PAD) ... gets exactly 0", rows 2, 4, 6, 9 "get 0"
    assert "`encoder.0.attn.k_proj.bias` has norm **0**" in text
    key_biases = [key for key in norm if key.endswith("k_proj.bias")]
    assert len(key_biases) == 3 and all(norm[key] == 0.0 for key in key_biases)
    assert [i for i, n in enumerate(embed_rows) if n == 0.0] == [0, 2, 4, 6, 9]

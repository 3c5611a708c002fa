"""Pictures: attention weights per head, loss curves, gradient norms.

matplotlib comes from the `plot` extra and is used through its object-oriented API
(a Figure with an Agg canvas, no pyplot state), so it works headless. Nothing else
in the engine imports it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from numpy_engine.checks import InputError


class MissingExtra(InputError):
    """matplotlib is not installed: the user asked for a picture without the plot extra."""


def check_matplotlib() -> None:
    """Raise MissingExtra now, before work that would end in a picture, if matplotlib is absent."""
    _figure(1, 1)


def _figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtra(
            "pictures need matplotlib: install the plot extra, pip install 'numpy-engine[plot]'"
        ) from None
    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _save(figure, out: str | Path) -> Path:
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out)
    except OSError as error:  # a directory of that name, no permission, a full disk
        raise InputError(f"{out}: cannot write the picture ({error.strerror})") from None
    return out


def plot_attention(panels: list[tuple[str, np.ndarray, list[str], list[str]]], out) -> Path:
    """panels: (title, weights (H, Tq, Tk), key labels, query labels).

    One row per panel, one column per head.
    """
    n_heads = max(weights.shape[0] for _, weights, _, _ in panels)
    figure = _figure(2.2 * n_heads + 1, 2.3 * len(panels) + 0.5)
    axes = figure.subplots(len(panels), n_heads, squeeze=False)
    for row, (title, weights, keys, queries) in enumerate(panels):
        for head in range(n_heads):
            ax = axes[row, head]
            if head >= weights.shape[0]:
                ax.set_axis_off()
                continue
            ax.imshow(weights[head], vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_xticks(*_some_labels(keys), fontsize=7, rotation=90)
            ax.set_yticks(*_some_labels(queries), fontsize=7)
            ax.set_title(f"{title}, head {head}", fontsize=8)
    figure.suptitle("attention weights (rows: queries, columns: keys; 0 dark, 1 bright)")
    figure.tight_layout()
    return _save(figure, out)


MOST_LABELS = 16  # tick labels on a head's axis: more, at 7 points, run into each other


def _some_labels(labels: list[str]) -> tuple[range, list[str]]:
    """(positions, their labels): every position's; or past MOST_LABELS every k-th's, k the
    fewest that fit, each after its position ("8 k"), since the labels between are not shown
    (a 58-character prompt's 58 labels on a 2.2-inch panel were one smear)."""
    if len(labels) <= MOST_LABELS:
        return range(len(labels)), labels
    positions = range(0, len(labels), -(-len(labels) // MOST_LABELS))  # k = ceil(n / MOST)
    return positions, [f"{i} {labels[i]}" for i in positions]


def plot_history(history: dict, out) -> Path:
    """Training loss per step; held-out loss (and exact match) at evaluations, if recorded;
    below it, the lr per step of a run with a schedule (history["lr"])."""
    lr = history.get("lr")
    figure = _figure(7, 5.5 if lr else 4)
    if lr:
        ax, lr_ax = figure.subplots(2, 1, sharex=True, height_ratios=[3, 1])
        _draw_lr(lr_ax, history["step"], lr)
    else:
        ax = figure.subplots()
    ax.plot(history["step"], history["train_loss"], lw=0.8, label="training loss (batch)")
    evals = history.get("eval", [])
    if evals:
        steps = [e["step"] for e in evals]
        ax.plot(steps, [e["heldout_loss"] for e in evals], "o-", label="held-out loss")
    if evals and "exact_match" in evals[0]:  # a sequence task's (a language model has none)
        match = ax.twinx()
        match.plot(
            steps,
            [e["exact_match"] for e in evals],
            "s--",
            color="tab:green",
            label="held-out exact match",
        )
        match.set_ylim(0, 1.05)
        match.set_ylabel("greedy exact match")
        match.legend(loc="center right", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("" if lr else "step")  # the lr panel below says it
    ax.set_ylabel("cross-entropy (log scale)")
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title("training")
    figure.tight_layout()
    return _save(figure, out)


def _draw_lr(ax, steps: list, lr: list) -> None:
    """The lr each step took (--schedule, --warmup), on a linear scale from 0."""
    ax.plot(steps, lr, lw=1.0, color="tab:purple")
    ax.set_ylim(0, 1.1 * max(lr))
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")


ZERO_NORM_AT = 1e-20  # where a norm of exactly 0 is drawn: a log scale has no 0


def plot_grad_norms(norms: dict[str, float], out, title: str) -> Path:
    """A horizontal bar per parameter: the norm of its gradient (log scale). A gradient that
    is exactly 0 (an attention key bias's, a parameter the batch never reached) is labelled
    so: its bar at ZERO_NORM_AT alone would read as a tiny number."""
    names = list(norms)
    figure = _figure(7, 0.18 * len(names) + 1.2)
    ax = figure.subplots()
    ax.barh(range(len(names)), [max(norms[n], ZERO_NORM_AT) for n in names])
    for row, name in enumerate(names):
        if norms[name] == 0:
            ax.annotate(
                "exactly 0",
                (ZERO_NORM_AT, row),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=6,
            )
    ax.set_yticks(range(len(names)), names, fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("gradient norm (log scale)")
    ax.set_title(title, fontsize=9)
    figure.tight_layout()
    return _save(figure, out)

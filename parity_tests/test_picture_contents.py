"""What each picture shows, read from its matplotlib Figure before it is saved: the data,
the colour scale and the axes that make it read right (test_pictures.py checks the files).

Sizes, font sizes and layout are left to the eye."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_engine import plots

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """Calls a plot function and returns the Figure it would have saved."""
    figures = []
    monkeypatch.setattr(plots, "_save", lambda figure, out: figures.append(figure) or out)

    def draw(plot, *args, **kwargs):
        assert plot(*args, out=tmp_path / "unused.png", **kwargs) == tmp_path / "unused.png"
        (figure,) = figures
        return figure

    return draw


def labels(ticks) -> list[str]:
    return [tick.get_text() for tick in ticks]


def test_attention_shows_each_heads_weights_on_one_fixed_scale(drawn):
    """A panel per row and a head per column, every image on 0..1 (so a uniform row looks
    dim, not bright), labelled by key and query; a panel with fewer heads leaves the rest
    of its row blank."""
    rng = np.random.default_rng(0)
    encoder = rng.dirichlet(np.ones(3), size=(2, 3))  # (H=2, Tq=3, Tk=3)
    cross = rng.dirichlet(np.ones(3), size=(1, 2))  # (H=1, Tq=2, Tk=3)
    figure = drawn(
        plots.plot_attention,
        [
            ("encoder", encoder, ["a", "b", "c"], ["a", "b", "c"]),
            ("cross", cross, ["a", "b", "c"], ["x", "y"]),
        ],
    )
    axes = np.array(figure.axes).reshape(2, 2)
    for row, (title, weights, queries) in enumerate(
        [("encoder", encoder, "abc"), ("cross", cross, "xy")]
    ):
        for head in range(weights.shape[0]):
            ax = axes[row, head]
            (image,) = ax.get_images()
            assert np.array_equal(image.get_array(), weights[head])
            assert image.get_clim() == (0.0, 1.0) and image.get_cmap().name == "viridis"
            assert labels(ax.get_xticklabels()) == ["a", "b", "c"]
            assert labels(ax.get_yticklabels()) == list(queries)
            assert ax.get_title() == f"{title}, head {head}" and ax.axison
    assert not axes[1, 1].axison and axes[1, 1].get_images() == []
    assert figure.get_suptitle().startswith("attention weights (rows: queries, columns: keys")
    width, height = figure.get_size_inches()
    assert width >= 2 * 2 and height >= 2 * 2  # at least 2 inches a head and a panel


@pytest.mark.parametrize("n, every", [(16, 1), (17, 2), (40, 3)])
def test_attention_over_a_long_prompt_labels_every_kth_position_with_its_number(drawn, n, every):
    """Up to plots.MOST_LABELS tokens every one is labelled; past it, every k-th, k the
    fewest that fit, each after its position (so a reader can count to the others)."""
    tokens = [chr(ord("a") + i % 26) for i in range(n)]
    weights = np.tril(np.ones((1, n, n))) / np.arange(1, n + 1)[:, None]
    figure = drawn(plots.plot_attention, [("layer 0", weights, tokens, tokens)])
    (ax,) = figure.axes
    shown = range(0, n, every)
    expected = tokens if every == 1 else [f"{i} {tokens[i]}" for i in shown]
    assert labels(ax.get_xticklabels()) == expected == labels(ax.get_yticklabels())
    assert list(ax.get_xticks()) == list(shown) == list(ax.get_yticks())


def test_the_loss_curve_on_a_log_scale_with_held_out_loss_and_exact_match(drawn):
    history = {
        "step": [1, 2, 3, 4],
        "train_loss": [2.0, 1.0, 0.5, 0.25],
        "eval": [
            {"step": 2, "heldout_loss": 1.5, "exact_match": 0.25},
            {"step": 4, "heldout_loss": 0.4, "exact_match": 1.0},
        ],
    }
    figure = drawn(plots.plot_history, history)
    loss, match = figure.axes
    train, heldout = loss.get_lines()
    assert train.get_label() == "training loss (batch)" and heldout.get_label() == "held-out loss"
    assert list(train.get_xdata()) == [1, 2, 3, 4] and list(train.get_ydata()) == [
        2.0,
        1.0,
        0.5,
        0.25,
    ]
    assert list(heldout.get_xdata()) == [2, 4] and list(heldout.get_ydata()) == [1.5, 0.4]
    assert loss.get_yscale() == "log" and loss.get_xlabel() == "step"
    assert loss.get_title() == "training"
    assert loss.get_ylabel() == "cross-entropy (log scale)" and loss.get_legend() is not None
    (exact,) = match.get_lines()
    assert exact.get_label() == "held-out exact match" and list(exact.get_ydata()) == [0.25, 1.0]
    assert match.get_ylim() == (0.0, 1.05) and match.get_ylabel() == "greedy exact match"
    assert match.get_legend() is not None


def test_a_language_models_held_out_loss_is_drawn_without_an_exact_match_axis(drawn):
    evals = [{"step": 2, "heldout_loss": 1.5}, {"step": 4, "heldout_loss": 0.4}]
    history = {"step": [1, 2, 3, 4], "train_loss": [2.0, 1.0, 0.5, 0.25], "eval": evals}
    (loss,) = drawn(plots.plot_history, history).axes
    train, heldout = loss.get_lines()
    assert list(heldout.get_xdata()) == [2, 4] and list(heldout.get_ydata()) == [1.5, 0.4]
    assert heldout.get_label() == "held-out loss" and len(train.get_xdata()) == 4


def test_a_run_without_evaluations_draws_its_training_loss_alone(drawn):
    figure = drawn(plots.plot_history, {"step": [1, 2], "train_loss": [1.0, 0.5]})
    (loss,) = figure.axes
    (train,) = loss.get_lines()
    assert list(train.get_ydata()) == [1.0, 0.5]


def test_a_scheduled_runs_lr_is_drawn_under_its_loss_from_0(drawn):
    evals = [{"step": 3, "heldout_loss": 1.5, "exact_match": 0.5}]
    history = {"step": [1, 2, 3], "train_loss": [2.0, 1.0, 0.5], "eval": evals}
    figure = drawn(plots.plot_history, history | {"lr": [0.0, 2e-3, 1e-3]})
    loss, lr, match = figure.axes
    (line,) = lr.get_lines()
    assert list(line.get_xdata()) == [1, 2, 3] and list(line.get_ydata()) == [0.0, 2e-3, 1e-3]
    assert lr.get_ylim() == pytest.approx((0.0, 2.2e-3)) and lr.get_ylabel() == "learning rate"
    assert lr.get_xlabel() == "step" and loss.get_xlabel() == ""  # one "step", at the bottom
    assert len(loss.get_lines()) == 2 and match.get_ylabel() == "greedy exact match"
    assert lr.get_position().y1 < loss.get_position().y0  # below the loss


def test_gradient_bars_read_top_down_in_the_parameters_order_on_a_log_scale(drawn):
    """A gradient of norm 0 (a parameter the batch never reached) still gets a bar on the
    log scale, at 1e-20, labelled "exactly 0"; a tiny norm that is not 0 is not labelled."""
    norms = {"tok_embed.weight": 0.5, "blocks.0.ln1.bias": 0.0, "head.bias": 2.0, "b": 1e-30}
    figure = drawn(plots.plot_grad_norms, norms, title="the title")
    (ax,) = figure.axes
    assert labels(ax.get_yticklabels()) == list(norms)
    assert [bar.get_width() for bar in ax.patches] == [0.5, 1e-20, 2.0, 1e-20]
    (zero,) = ax.texts
    assert zero.get_text() == "exactly 0" and zero.xy == (1e-20, 1)
    assert [bar.get_y() + bar.get_height() / 2 for bar in ax.patches] == [0, 1, 2, 3]
    assert ax.yaxis_inverted() and ax.get_xscale() == "log"
    assert ax.get_title() == "the title" and ax.get_xlabel() == "gradient norm (log scale)"


def test_gradient_bars_grow_the_picture_with_the_parameters(drawn):
    """148 parameter arrays (GPT-2 has as many in Hugging Face's layout): each bar keeps
    room for its label's line."""
    figure = drawn(plots.plot_grad_norms, {f"p{i}": 1.0 for i in range(148)}, title="t")
    assert figure.get_size_inches()[1] >= 0.15 * 148


def test_save_makes_the_directory_and_writes_the_file(tmp_path):
    figure = plots._figure(1, 1)
    out = plots._save(figure, str(tmp_path / "new" / "picture.png"))
    assert out == tmp_path / "new" / "picture.png" and out.stat().st_size > 0

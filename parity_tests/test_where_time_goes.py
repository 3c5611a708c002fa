"""benchmarks/where_time_goes.py: a step by part (step_parts.py), its floor, and what the speed
issue's bars ask of each part. Known times and the forty-third session's Intel profiles stand
in for timing."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import step_parts, workloads
from benchmarks import where_time_goes as W
from parity_tests.helpers import recorded_thread_settings


def test_where_time_goes_parts_and_floor_of_a_copy_step():
    """Every layer function of the copy model's step is timed under its part (and put back
    after), the parts and "between layers" make up the instrumented step, and the floor finds
    the step's 56 matrix products (3 per linear layer, 6 per attention, and the one-hot
    product of each embedding gradient, source and target) and its calls."""
    from numpy_engine import activations, layers, multihead, optim

    originals = (layers.linear_forward, multihead.linear_forward, optim.Optimizer.step)
    engine = W.engine_parts("copy", steps=2)
    assert (layers.linear_forward, multihead.linear_forward, optim.Optimizer.step) == originals
    gelu = (activations.gelu_forward, activations.gelu_backward)
    assert activations.ACTIVATIONS["gelu"] == gelu  # put back
    for part in ("linear", "attention", "layernorm", "activation", "embedding", "loss"):
        assert engine["parts"][part] > 0, part
    assert abs(sum(engine["parts"].values()) - engine["instrumented"]) < 1e-9
    low = W.floor("copy")
    assert low["products"] == 56
    # 88 broadcasts: each layernorm's 8 (the mean and rstd forward and back, its weight and
    # bias, the weight's again in the backward: 7 layernorms), 12 biases, the softmax's row
    # max, its backward's row sum and the keys' mean (3 attentions), the zero-sum
    # gradients' 3, the loss's 3, the embeddings' 2 one-hots, the positions' 2 and the
    # decoder's mask
    assert low["broadcasts"] == 88
    assert 0 < low["broadcasts_ms"] < 10 and 0 < low["broadcasts_whole_ms"] < 10
    assert low["calls"] > 100 and 0 < low["matmul"] < 10 and 0 < low["passes"] < 10
    # copy's 38 two-dimensional products and 18 of attention's, alone and where the step
    # makes them
    assert set(low["matmul_by_kind"]) == set(low["in_step_by_kind"]) == {"2-D", "batched"}
    assert abs(sum(low["matmul_by_kind"].values()) - low["matmul"]) < 1e-12
    for kind in ("2-D", "batched"):
        assert 0 < low["matmul_by_kind"][kind] < 10 and 0 < low["in_step_by_kind"][kind] < 10
    assert W._product_kind((3, 4), (4, 5)) == "2-D"
    assert W._product_kind((2, 3, 4), (2, 4, 5)) == "batched"
    assert W._product_kind((3, 4), (2, 4, 5)) == W._product_kind((2, 3, 4), (4, 5)) == "batched"
    assert W._product_kind((3, 4), (4,)) is None and W._product_kind((4,), (4, 5)) is None
    assert step_parts._torch_part("aten::addmm") == "matmul"
    assert step_parts._torch_part("aten::native_layer_norm_backward") == "layernorm"
    assert step_parts._torch_part("aten::copy_") == "other ops"
    assert step_parts._torch_part("autograd::engine::evaluate_function: MmBackward0") == "autograd"


def test_where_time_goes_floor_adds_up_what_it_times(monkeypatch):
    """With every timing 1 ms, the floor's sums count what it timed: the step's two 2-D
    products and one batched product, alone and where the step makes them (each counted
    step's products timed by call_count's clock); one pass over each product's output and
    over the matrix of each sum done as a product with ones; the optimizer's four vectors;
    the step's six calls at the cheapest call's price."""
    import itertools

    from benchmarks import call_count

    class Model:
        flat = np.zeros(6)
        params = {"w": flat.reshape(2, 3)}

    def step(model, optimizer, batch):
        a, b, c, d, ones = batch
        _ = a @ b, np.matmul(a, b), c @ d  # 2-D twice, batched once
        _ = a @ ones, ones @ b  # sums as products with ones: no matrix products
        np.exp(a)  # a call, not a product
        _ = a - ones  # a call that broadcasts

    arrays = (np.ones((3, 4)), np.ones((4, 5)), np.ones((2, 3, 4)), np.ones((2, 4, 5)), np.ones(4))
    monkeypatch.setattr(W, "engine_side", lambda name, n: (Model(), None, [arrays] * n, step))
    monkeypatch.setattr(W, "best_seconds", lambda fn, repeats=5: (fn(), 1e-3)[1])
    clock = itertools.count(1.0, 1e-3)  # each timed product starts and ends 1 ms apart
    monkeypatch.setattr(call_count, "perf_counter", lambda: next(clock))
    low = W.floor("fake")
    assert low["products"] == 3 and low["calls"] == 7 and low["broadcasts"] == 1
    assert low["matmul_by_kind"] == pytest.approx({"2-D": 2.0, "batched": 1.0}, abs=1e-9)
    assert low["in_step_by_kind"] == pytest.approx({"2-D": 2.0, "batched": 1.0}, abs=1e-9)
    assert low["matmul"] == pytest.approx(3.0) and low["passes"] == pytest.approx(5.0)
    assert low["optimizer"] == pytest.approx(4.0) and low["call_us"] == pytest.approx(1e3)
    assert low["calls_ms"] == pytest.approx(7.0)
    assert low["broadcasts_ms"] == low["broadcasts_whole_ms"] == pytest.approx(1.0)


def test_where_time_goes_times_each_broadcast_as_made_and_with_whole_operands(monkeypatch):
    """Each recorded broadcast is timed twice into an output of the whole shape: on arrays
    of its operands' shapes and dtypes, then on arrays of the whole shape; the best of 200
    calls, or of 5 past 64K entries."""
    timed = []
    monkeypatch.setattr(
        W, "best_seconds", lambda fn, repeats=5: timed.append((fn, repeats)) or 1e-3
    )
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    recorded = [
        (np.multiply, (((4, 3), f32), ((4, 1), f32))),
        (np.add, (((256, 256), f32), ((256,), f32))),
        (np.less, (((3,), f32), ((2, 1), f32))),
        (np.equal, (((6, 1), i64), ((5,), i64))),  # a one-hot's compare
    ]
    got = W._broadcasts_ms(recorded)
    assert got == pytest.approx({"broadcasts_ms": 4.0, "broadcasts_whole_ms": 4.0})
    shapes = [tuple(x.shape for x in fn.args) for fn, _ in timed]
    assert shapes == [
        ((4, 3), (4, 1)),
        ((4, 3), (4, 3)),
        ((256, 256), (256,)),
        ((256, 256), (256, 256)),
        ((3,), (2, 1)),
        ((2, 3), (2, 3)),
        ((6, 1), (5,)),
        ((6, 5), (6, 5)),
    ]
    assert [repeats for _, repeats in timed] == [200, 200, 5, 5, 200, 200, 200, 200]
    dtypes = [tuple(x.dtype for x in fn.args) for fn, _ in timed]
    assert dtypes == [
        tuple(dtype for _, dtype in operands) for _, operands in recorded for _ in "ab"
    ]
    outs = [(fn.keywords["out"].shape, fn.keywords["out"].dtype) for fn, _ in timed]
    assert (
        outs[::2]
        == outs[1::2]
        == [((4, 3), f32), ((256, 256), f32), ((2, 3), np.dtype(bool)), ((6, 5), np.dtype(bool))]
    )
    assert [fn.func for fn, _ in timed[::2]] == [np.multiply, np.add, np.less, np.equal]


def test_where_time_goes_report_prints_the_floor_and_the_broadcasts(monkeypatch):
    """The report's lines: each engine's step and parts, the floor's sum, the broadcasts'
    two times and the products where the step makes them."""
    asked = []
    engine = {"step": 1.0, "instrumented": 1.1, "parts": {"linear": 0.5, "loss": 0.25}}
    monkeypatch.setattr(W, "engine_parts", lambda n, s: asked.append(("engine", n, s)) or engine)
    reference = {"step": 3.0, "parts": {"matmul": 1.0}}
    monkeypatch.setattr(W, "torch_parts", lambda n, s: asked.append(("torch", n, s)) or reference)
    low = {
        "products": 5,
        "matmul": 0.2,
        "passes": 0.1,
        "optimizer": 0.05,
        "calls": 40,
        "call_us": 0.9,
        "calls_ms": 0.036,
        "broadcasts": 7,
        "broadcasts_ms": 0.02,
        "broadcasts_whole_ms": 0.008,
        "matmul_by_kind": {"2-D": 0.15, "batched": 0.05},
        "in_step_by_kind": {"2-D": 0.18, "batched": 0.07},
    }
    monkeypatch.setattr(W, "floor", lambda n: asked.append(("floor", n)) or low)
    lines = W.report("copy", 5).splitlines()
    assert asked == [("engine", "copy", 5), ("torch", "copy", 5), ("floor", "copy")]
    assert lines[:3] == [
        "copy: engine 1.00 ms a step, torch 3.00 ms (each alone, median of 5)",
        "  engine, by part (own time, ms, of 1.10 instrumented): linear 0.50, loss 0.25",
        "  torch, by part (own time, ms; forward and backward profiled): matmul 1.00",
    ]
    assert lines[3] == (
        "  floor: 5 products alone 0.20 ms + one pass over each output 0.10 + the optimizer's "
        "four vectors once 0.05 = 0.35 ms; 40 NumPy calls at 0.90 us (the cheapest call) "
        "0.04 ms more"
    )
    assert lines[4] == (
        "  7 of the calls spread an operand over rows (a bias, a row's mean): 0.02 ms alone, "
        "0.01 ms with each operand at the whole shape"
    )
    assert lines[5].endswith("2-D 0.18 ms against 0.15 alone, batched 0.07 ms against 0.05 alone")
    assert len(lines) == 6  # no bar given: no bar's lines
    with_bar = W.report("copy", 5, bar=0.25).splitlines()
    assert with_bar[:6] == lines
    assert with_bar[6:] == W._bar_lines("copy", 0.25, engine, reference, low)
    assert len(with_bar) == 8  # 1.00 ms over a 0.75 ms bar: the split and what it asks


# The forty-third session's Intel profiles (docs/performance.md, section 4), in ms: each step
# alone, torch's matmul, the products in the step and alone by kind. Its table was worked out
# by hand; bar_accounting must give the same.
INTEL_CHAR_LM = (
    {"step": 14.31},
    {"step": 16.18, "parts": {"matmul": 7.25, "attention": 1.96}},
    {
        "in_step_by_kind": {"2-D": 7.51, "batched": 1.22},
        "matmul_by_kind": {"2-D": 6.24, "batched": 0.59},
    },
)
INTEL_GPT2 = (
    {"step": 1817.73},
    {"step": 2118.85, "parts": {"matmul": 1145.45}},
    {
        "in_step_by_kind": {"2-D": 1283.94, "batched": 23.47},
        "matmul_by_kind": {"2-D": 1168.43, "batched": 10.40},
    },
)


def test_where_time_goes_bar_accounting_splits_each_step_as_the_intel_table_did():
    """torch_reference's workloads set the engine's 2-D products against torch's matmul
    (attention's batched ones are in each side's rest); gpt2 sets all of them (transformers'
    attention multiplies with matmul)."""
    a = W.bar_accounting("char-lm", 0.80, *INTEL_CHAR_LM)
    assert a["kinds"] == ("2-D",) and not a["met"]
    assert a["bar_step"] == pytest.approx(12.944)  # 0.80 x 16.18
    assert (a["products"], a["products_alone"]) == (7.51, 6.24)
    assert a["rest"] == pytest.approx(6.80)  # 14.31 - 7.51
    assert a["torch_matmul"] == 7.25
    assert a["products_asked"] == pytest.approx(6.144)  # the table's 6.14 ms, 0.98x alone
    assert a["rest_asked"] == pytest.approx(5.434)  # the table's 5.43 ms, a fifth less
    g = W.bar_accounting("gpt2", 0.80, *INTEL_GPT2)
    assert g["kinds"] == ("2-D", "batched")
    assert g["products"] == pytest.approx(1307.41) and g["rest"] == pytest.approx(510.32)
    assert g["products_alone"] == pytest.approx(1178.83)
    assert g["products_asked"] == pytest.approx(1184.76)  # the table's, 1.005x alone
    assert g["rest_asked"] == pytest.approx(387.67)
    assert W.bar_accounting("gpt2", 1.00, *INTEL_GPT2)["met"]
    engine, reference, low = INTEL_GPT2
    exactly = W.bar_accounting("gpt2", engine["step"] / reference["step"], *INTEL_GPT2)
    assert exactly["met"]  # a step at the bar is within it


def test_where_time_goes_bar_lines_say_what_the_bar_asks_of_each_part():
    split = (
        "  the bar, 0.80 of torch's step: 12.94 ms; its 2-D products 7.51 ms in the step "
        "(6.24 alone) and the rest 6.80, against torch's matmul 7.25 and rest 8.93 "
        "(each step alone)"
    )
    assert W._bar_lines("char-lm", 0.80, *INTEL_CHAR_LM) == [
        split,
        "    over it by 1.37 ms: with the rest as it is, the products would have to take "
        "6.14 ms, 0.98x their time alone; with the products as they are, the rest would have "
        "to take 5.43 ms, 20% less",
    ]
    assert W._bar_lines("gpt2", 1.00, *INTEL_GPT2) == [
        "  the bar, 1.00 of torch's step: 2118.85 ms; all its products 1307.41 ms in the step "
        "(1178.83 alone) and the rest 510.32, against torch's matmul 1145.45 and rest 973.40 "
        "(each step alone): the engine's 1817.73 ms is within it"
    ]
    # a bar under the products alone (7.51 ms) but over the rest (6.80): 0.44 x 16.18 = 7.12
    assert W._bar_lines("char-lm", 0.44, *INTEL_CHAR_LM)[1] == (
        "    over it by 7.19 ms: with the rest as it is, the products would have to take "
        "0.32 ms, 0.05x their time alone; the products alone, 7.51 ms, leave the rest no time"
    )
    # copy's rest (1.08 ms) is the larger part: a bar of 0.37 ms is under it alone
    copy = (
        {"step": 1.25},
        {"step": 3.68, "parts": {"matmul": 0.30}},
        {"in_step_by_kind": {"2-D": 0.17}, "matmul_by_kind": {"2-D": 0.11}},
    )
    assert W._bar_lines("copy", 0.10, *copy)[1] == (
        "    over it by 0.88 ms: the rest alone, 1.08 ms, leaves the products no time; with the "
        "products as they are, the rest would have to take 0.20 ms, 82% less"
    )
    # under both parts alone
    assert W._bar_lines("char-lm", 0.30, *INTEL_CHAR_LM)[1] == (
        "    over it by 9.46 ms: the rest alone, 6.80 ms, leaves the products no time; the "
        "products alone, 7.51 ms, leave the rest no time"
    )
    # a part that takes exactly the bar's time (1.0 ms: exact in binary) leaves the other none
    for products, named in ((2.0, "the rest alone, 1.00"), (1.0, "the products alone, 1.00")):
        exact = (
            {"step": 3.0},
            {"step": 4.0, "parts": {"matmul": 1.0}},
            {"in_step_by_kind": {"2-D": products}, "matmul_by_kind": {"2-D": 0.5}},
        )
        over = W._bar_lines("copy", 0.25, *exact)[1]
        assert over.startswith("    over it by 2.00 ms: the rest alone, ")
        assert named in over and "would have to take" not in over


def test_where_time_goes_names_the_blas_and_processor_before_its_reports(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the worker's stays as it is
    monkeypatch.setattr(
        W, "report", lambda name, steps, bar: f"report of {name}, {steps} steps, bar {bar}"
    )
    monkeypatch.setattr(workloads, "processor_name", lambda: "Some CPU, 2 cores")
    monkeypatch.setattr(workloads, "numpy_blas", lambda: "openblas (SkylakeX)")
    W.main(["copy", "large", "char-lm", "gpt2"])
    assert capsys.readouterr().out.splitlines() == [
        "one thread; NumPy's BLAS openblas (SkylakeX); Some CPU, 2 cores",
        "report of copy, 50 steps, bar 0.3",  # the speed issue's bars
        "report of large, 4 steps, bar 1.0",
        "report of char-lm, 50 steps, bar 0.8",
        "report of gpt2, 3 steps, bar 1.0",
    ]


def test_where_time_goes_sets_the_threads_it_is_given(monkeypatch, capsys):
    """--threads N: BLAS and torch take N threads while the reports run, and the first line
    says how many; freed memory is kept for the next step, as in the bench and in training."""
    asked = recorded_thread_settings(monkeypatch)
    monkeypatch.setattr(W, "report", lambda name, steps, bar: f"report of {name}, bar {bar}")
    monkeypatch.setattr(workloads, "processor_name", lambda: "Some CPU, 2 cores")
    monkeypatch.setattr(workloads, "numpy_blas", lambda: "openblas (Haswell)")
    W.main(["char-lm", "--threads", "2"])
    assert capsys.readouterr().out.splitlines() == [
        "2 threads; NumPy's BLAS openblas (Haswell); Some CPU, 2 cores",
        "report of char-lm, bar None",  # the bars are one thread's
    ]
    assert asked == {"torch": [2], "blas": [2], "memory kept": [True]}

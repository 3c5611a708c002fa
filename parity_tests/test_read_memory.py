"""What reading a checkpoint or a Hugging Face directory holds in memory: a resumed run holds
the moments once, a resumed optimizer and its checkpoint never hold them whole at once,
weights are read into the model one at a time, and a resumed run reads its checkpoint
before malloc is told to keep freed memory. Measured by tracemalloc, and by the resident
memory (/proc/self/status) of a fresh process (in_a_fresh_process). What a run counts
before its first step: test_step_memory.py."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from numpy_engine import checkpoint as checkpoint_module
from numpy_engine import memory, train
from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.configs import REFERENCE_RUNS
from numpy_engine.loop import Checkpointing
from numpy_engine.models import GPT2, GPT2Config
from numpy_engine.optim import AdamW


@pytest.fixture(autouse=True)
def glibcs_own_malloc_settings():
    """These tests read as `generate` and a resumed run read, under glibc's own settings
    (the run reads its checkpoint before memory.keep_freed_memory), which a test before
    them in this process may have changed: mallopt is process-wide. glibc's defaults: maps
    arrays over 128 KiB, up to 65536 of them, and trims a free top over 128 KiB."""
    mallopt = memory.glibc_mallopt()
    for option, default in ((-4, 65536), (-3, 128 * 1024), (-1, 128 * 1024)):
        assert mallopt(option, default) == 1  # M_MMAP_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD


def test_a_resumed_run_holds_the_moments_once(tmp_path):
    """The moments read from a checkpoint go into the optimizer, and the checkpoint's own
    arrays of them go: kept for the whole resumed run (the command line holds the checkpoint
    it checked the flags against), they were twice the parameters' bytes more (1 GB on
    GPT-2), which the memory check, counting the optimizer as made, did not count. Of what
    reading the checkpoint allocated, the model's parameters alone are left."""
    out = tmp_path / "run"
    run_config = replace(REFERENCE_RUNS["char-lm"], steps=2, batch_size=1, context=4)
    train.train_char_lm(run_config, progress_stream=None, checkpointing=Checkpointing(out, 1))
    tracemalloc.start(16)  # frames enough to see checkpoint.py under each array it made
    try:
        checkpoint = load_checkpoint(out)
        run = train.resume(out, progress_stream=None, steps=4, checkpoint=checkpoint)
        read = tracemalloc.Filter(True, checkpoint_module.__file__, all_frames=True)
        held = tracemalloc.take_snapshot().filter_traces([read]).statistics("filename")
    finally:
        tracemalloc.stop()
    assert run.result["steps"] == 4 and checkpoint.model is run.model
    parameter_bytes = run.model.flat.nbytes
    assert parameter_bytes <= sum(stat.size for stat in held) < 1.5 * parameter_bytes


def in_a_fresh_process(check: str, *args: str) -> subprocess.CompletedProcess:
    """This module's function check(*args), run in a new interpreter. Resident memory is the
    whole process's, and a process that has run other tests keeps their heap: where an
    earlier test had malloc keep freed memory, a 40 MiB array came from the heap's free
    memory, calloc writing its zeros, not from fresh pages that hold nothing until written
    (the moments' test then read 160 MiB of growth, its bound 80)."""
    call = f"from parity_tests import test_read_memory as t; t.{check}(*{list(args)!r})"
    return subprocess.run(
        [sys.executable, "-c", call],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=300,
    )


def resident_mib(field: str) -> int:
    """/proc/self/status's VmRSS (now) or VmHWM (the most since the last reset_peak), MiB."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) // 1024  # the file counts in KiB


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # Linux: VmHWM starts again from VmRSS


def test_a_resumed_optimizer_and_its_checkpoint_never_hold_the_moments_whole_at_once():
    done = in_a_fresh_process("resumed_moments_never_whole_twice")
    assert done.returncode == 0, done.stderr  # the check's own assertion, where one failed


def resumed_moments_never_whole_twice() -> None:
    """Resuming, the optimizer's moments are zeroed pages that take no memory until written
    (memory.aligned_zeros), and each of the checkpoint's arrays goes once copied into them
    (load_state_dict(consume=True)): the two sets of moments are never both whole in memory.
    Both were, before: a resumed 124M GPT-2's peak RSS 2472 MB, 2274 now (a new run's 2275).
    Two parameters of 40 MiB each, so that their arrays are mapped apart from the heap
    (glibc maps arrays over 128 KiB) and go back to the system when freed. In the command's
    order: the checkpoint read, then malloc told to keep freed memory, then the optimizer."""
    entries = 10 * 2**20  # 40 MiB of float32
    params = {key: np.zeros(entries, np.float32) for key in ("a", "b")}
    saved = AdamW(params).state_dict()
    saved = {key: np.full_like(value, 0.5) for key, value in saved.items() if key != "step"}
    saved["step"] = np.array(3)
    memory.keep_freed_memory()
    reset_peak()
    start = resident_mib("VmRSS")
    optimizer = AdamW(params)
    optimizer.load_state_dict(saved, consume=True)
    assert saved == {} and optimizer.step_count == 3
    assert all((vector == 0.5).all() for vector in optimizer.flat_state.values())
    # the moments now hold what the checkpoint's arrays held: one of them at most was both
    assert resident_mib("VmHWM") - start < 2 * 40
    assert resident_mib("VmRSS") - start < 40


def test_a_checkpoints_weights_are_read_into_the_model_one_at_a_time(tmp_path):
    done = in_a_fresh_process("checkpoint_read_one_weight_at_a_time", str(tmp_path))
    assert done.returncode == 0, done.stderr  # the check's own assertion, where one failed


def checkpoint_read_one_weight_at_a_time(tmp: str) -> None:
    """A checkpoint's model writes nothing to its vector before each weight, and its weights
    are read one at a time, each let go of once copied (Model.read_params): the read's peak
    is the model and one weight, not the model and all its weights read (`numpy-engine
    generate` from a 124M GPT-2: peak RSS 1281 -> 615 MB). Four weights of 40 MiB each,
    mapped apart from the heap as glibc maps arrays over 32 MiB."""
    tmp_path = Path(tmp)
    config = GPT2Config(vocab_size=40960, max_len=40960, d_model=256, n_heads=2, d_ff=40960)
    model = GPT2(replace(config, n_layers=1, dtype="float32"), seed=0)
    save_checkpoint(tmp_path, model)
    largest, vector = 40, model.flat.nbytes // 2**20  # MiB: the four weights and a little
    del model
    reset_peak()
    start = resident_mib("VmRSS")
    read = load_checkpoint(tmp_path).model
    assert vector == read.flat.nbytes // 2**20 and 4 * largest <= vector < 4 * largest + 8
    assert resident_mib("VmHWM") - start < vector + largest + 16  # was 2 * vector
    assert resident_mib("VmRSS") - start < vector + 16


def test_import_hf_reads_its_tensors_into_the_model_one_at_a_time(tmp_path):
    done = in_a_fresh_process("import_hf_reads_one_tensor_at_a_time", str(tmp_path))
    assert done.returncode == 0, done.stderr  # the check's own assertion, where one failed


def import_hf_reads_one_tensor_at_a_time(tmp: str) -> None:
    """import-hf reads each safetensors tensor only when the model's weight it becomes is
    written, by pread (hf.TensorFiles): its peak is the model and one tensor, not the model
    and every tensor as well (a random 124M GPT-2: peak RSS 1004 -> 541 MB). The weights of
    the checkpoint test above, as a Hugging Face directory."""
    import json

    from safetensors.numpy import save_file

    from numpy_engine import hf

    tmp_path = Path(tmp)
    config = GPT2Config(vocab_size=40960, max_len=40960, d_model=256, n_heads=2, d_ff=40960)
    model = GPT2.unwritten(replace(config, n_layers=1, dtype="float32"))
    for i, view in enumerate(model.params.values()):
        view[...] = i / 16  # each weight its own value: a weight misplaced would show
    save_file(hf.hf_state_from_engine(model.params, 1), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(hf.hf_config_from_engine(model.config)))
    largest, vector = 40, model.flat.nbytes // 2**20  # MiB: the four weights and a little
    reset_peak()
    start = resident_mib("VmRSS")
    run = hf.import_hf(tmp_path, tmp_path / "run")
    assert resident_mib("VmHWM") - start < vector + largest + 16  # was 2 * vector
    assert np.array_equal(load_checkpoint(run).model.flat, model.flat)


def test_a_resumed_run_reads_its_checkpoint_before_malloc_keeps_freed_memory(tmp_path, monkeypatch):
    """Told to keep freed memory, glibc keeps it in the heap: a checkpoint read before that
    goes back to the system once the model and optimizer hold their copies (a resumed GPT-2
    run's peak 2892 -> 2763 MB, measured). A new run is told before it trains."""
    from numpy_engine import checkpoint, cli

    order = []
    monkeypatch.setattr(memory, "keep_freed_memory", lambda: order.append("keep freed memory"))
    read = checkpoint.load_checkpoint
    monkeypatch.setattr(
        checkpoint, "load_checkpoint", lambda path: order.append("read") or read(path)
    )
    run = ["train", "char-lm", "--steps", "2", "--batch-size", "2", "--context", "8", "--quiet"]
    assert cli.main([*run, "--out", str(tmp_path)]) == 0
    assert order == ["keep freed memory"]
    order.clear()
    assert cli.main(["train", "--resume", str(tmp_path), "--steps", "3", "--quiet"]) == 0
    assert order == ["read", "keep freed memory"]

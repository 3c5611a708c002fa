"""The mutation tool (python -m mutation): its targets exist, it makes the mutants it says,
and a run reports exactly the mutants a project's tests miss."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mutation.mutants import find_function, mutants, sites
from mutation.run import main
from mutation.targets import CODE, NUMBER_TESTS, code_targets

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("code", CODE)
def test_every_target_is_one_function_with_mutants(code):
    for path, function in code_targets(code):
        tree = ast.parse((ROOT / path).read_text())  # LookupError if gone, renamed or ambiguous
        assert list(sites(find_function(tree, function, path))), f"{path}:{function}"


def test_each_mutated_files_own_tests_are_among_those_a_mutant_runs():
    """A file's own tests (test_dropout.py for dropout.py) are where its numbers are
    checked: without them a run reports as survivors mutants that they kill."""
    mutated = {Path(path).stem for files in CODE.values() for path in files}
    own = {f"parity_tests/test_{stem}.py" for stem in mutated}
    missing = {path for path in own if (ROOT / path).exists()} - set(NUMBER_TESTS)
    assert not missing, f"the mutated files' own tests, not in NUMBER_TESTS: {sorted(missing)}"


SMALL_BACKWARD = '''
def scale_backward(dout, dextra, cache):
    """Docstring: not mutated."""
    x, weight = cache.x, cache.weight
    dx = np.add(dout, dextra)
    dx *= np.multiply(weight, weight)
    np.negative(dx, out=dx)
    if not x.size > 0:
        raise ValueError(f"empty {x.size + 1}")
    return -dx.reshape(-1)
'''


def test_each_kind_of_mutant_of_a_small_backward(tmp_path):
    (tmp_path / "small.py").write_text(SMALL_BACKWARD)
    found = mutants(tmp_path, [("small.py", "scale_backward")])
    made = sorted((m.line, m.kind, m.after) for m in found)
    assert made == [
        (4, "attribute", "x, weight = (cache.weight, cache.weight)"),
        (4, "attribute", "x, weight = (cache.x, cache.x)"),
        (5, "name", "dx = np.add(dextra, dextra)"),
        (5, "name", "dx = np.add(dout, dout)"),
        (5, "swap", "dx = np.add(dextra, dout)"),
        (6, "deletion", "pass"),
        (6, "name", "dx *= np.multiply(weight, x)"),
        (6, "name", "dx *= np.multiply(x, weight)"),
        (6, "operator", "dx /= np.multiply(weight, weight)"),
        (7, "deletion", "pass"),
        (7, "name", "np.negative(dextra, out=dx)"),
        (7, "name", "np.negative(dout, out=dx)"),
        (7, "name", "np.negative(dx, out=dextra)"),
        (7, "name", "np.negative(dx, out=dout)"),
        (8, "comparison", "if not x.size >= 0:"),
        (8, "constant", "if not x.size > 1:"),
        (8, "name", "if not weight.size > 0:"),
        (8, "negation", "if not not x.size > 0:"),
        (10, "name", "return -dextra.reshape(-1)"),
        (10, "name", "return -dout.reshape(-1)"),
        (10, "negation", "return +dx.reshape(-1)"),
        (10, "negation", "return -dx.reshape(+1)"),
    ]
    # the raise, its f-string, the docstring, reshape's 1 and a swap of (weight, weight) are
    # left alone; ids are unique
    assert len({m.id for m in found}) == len(found) == 22


# The toy project's pytest arguments: its tests use no Hypothesis, and loading its plugin is
# half of each mutant's run (0.7 s of 1.5 measured)
TOY_TESTS = "test_engine.py -p no:hypothesispytest"


def relu_project(tmp_path: Path, test_body: str) -> Path:
    """A project of one backward, relu_backward, and test_engine.py with test_body."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "engine.py").write_text("def relu_backward(dout, x):\n    return dout * (x > 0)\n")
    (project / "test_engine.py").write_text(textwrap.dedent(test_body))
    return project


RELU_TEST_AWAY_FROM_ZERO = """
    import numpy as np
    from engine import relu_backward

    def test_relu_backward_away_from_zero():  # x = 0 and 0 < x < 1 never tried
        x, dout = np.array([-2.0, 3.0]), np.array([5.0, 7.0])
        assert relu_backward(dout, x).tolist() == [0.0, 7.0]
    """
SURVIVORS = {  # the mutants RELU_TEST_AWAY_FROM_ZERO misses, by kind: what the report says
    "comparison": "engine.py:2 relu_backward (comparison): "
    "return dout * (x > 0)  ->  return dout * (x >= 0)",
    "constant": "engine.py:2 relu_backward (constant): "
    "return dout * (x > 0)  ->  return dout * (x > 1)",
}


def test_a_run_reports_the_mutants_the_tests_miss_and_resumes_from_its_log(tmp_path, capsys):
    project = relu_project(tmp_path, RELU_TEST_AWAY_FROM_ZERO)
    log = tmp_path / "mutants.jsonl"
    args = ["--root", str(project), "--target", "engine.py:relu_backward"]
    args += ["--tests", TOY_TESTS, "--jobs", "2", "--log", str(log)]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    survivors = sorted(line for line in out if line.startswith("survived"))
    assert [line.split("  ", 2)[2] for line in survivors] == sorted(SURVIVORS.values())
    assert out[-1] == "3 mutants: 1 killed, 0 timed out, 2 survived"
    assert len(log.read_text().splitlines()) == 3
    assert (project / "engine.py").read_text().endswith("dout * (x > 0)\n")  # never written
    assert main(args) == 0  # again: every mutant is in the log, none is run
    captured = capsys.readouterr()
    assert sorted(captured.out.splitlines()) == sorted(out)
    assert "3 mutants, 3 already in the log" in captured.err


def test_ids_run_the_mutants_named_as_list_and_the_report_print_them(tmp_path, capsys):
    project = relu_project(tmp_path, RELU_TEST_AWAY_FROM_ZERO)
    root = ["--root", str(project)]
    assert main([*root, "--target", "engine.py:relu_backward", "--list"]) == 0
    listed = {
        line.split("(")[1].split(")")[0]: line for line in capsys.readouterr().out.splitlines()
    }
    assert set(listed) == {"comparison", "constant", "operator"}
    chosen = tmp_path / "chosen.txt"
    chosen.write_text(f"# the one that survives\n\n{listed['comparison']}\n")
    run = [*root, "--ids", str(chosen), "--tests", TOY_TESTS, "--jobs", "1"]
    assert main(run) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"survived  {listed['comparison']}",
        "1 mutants: 0 killed, 0 timed out, 1 survived",
    ]
    chosen.write_text(out[0] + "\n" + listed["operator"] + "\n")  # the report's line, as it is
    assert main(run) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1] == "2 mutants: 1 killed, 0 timed out, 1 survived"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("engine.py::relu_backward#0-00000000\n", "engine.py::relu_backward#0-00000000 is not a"),
        ("relu_backward\n", "chosen.txt:1: 'relu_backward' is not a mutant id"),
        ("# nothing\n\n", "no mutant ids in it"),
    ],
)
def test_ids_that_name_no_mutant_are_refused(tmp_path, capsys, text, message):
    project = relu_project(tmp_path, RELU_TEST_AWAY_FROM_ZERO)
    chosen = tmp_path / "chosen.txt"
    chosen.write_text(text)
    with pytest.raises(SystemExit) as stopped:
        main(["--root", str(project), "--ids", str(chosen)])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_sigterm_stops_a_run_its_tests_and_removes_the_copies(tmp_path):
    """The mutant x > 1 makes the test sleep a minute; SIGTERM must end that test, not wait."""
    project = relu_project(
        tmp_path,
        """
        import os, time
        from engine import relu_backward

        def test_relu_backward_sleeps_when_broken():
            if relu_backward(1.0, 0.5) == 0:  # the mutant x > 1
                with open(os.environ["STARTED"] + ".part", "w") as started:
                    started.write(str(os.getpid()))
                # whole or not there: the test waits for the file, then reads the pid
                os.replace(os.environ["STARTED"] + ".part", os.environ["STARTED"])
                time.sleep(60)
        """,
    )
    started, temporary = tmp_path / "started", tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "STARTED": str(started), "TMPDIR": str(temporary)}
    args = ["--root", str(project), "--target", "engine.py:relu_backward", "--kinds", "constant"]
    log = tmp_path / "mutants.jsonl"
    args += ["--tests", TOY_TESTS, "--jobs", "1", "--log", str(log)]
    run = subprocess.Popen(
        [sys.executable, "-m", "mutation", *args], cwd=ROOT, env=env, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.05)
        assert started.exists(), "the mutant's test never started"
        run.send_signal(signal.SIGTERM)
        stopped_in = time.monotonic()
        _, err = run.communicate(timeout=30)
        assert run.returncode == 128 + signal.SIGTERM
        assert time.monotonic() - stopped_in < 30  # not the test's minute
        assert "stopped; the mutants run so far are in" in err.decode()
    finally:  # a failed check leaves no run behind
        if run.poll() is None:
            run.kill()
            run.communicate()
    with pytest.raises(ProcessLookupError):  # the test's process is gone
        os.kill(int(started.read_text()), 0)
    assert list(temporary.iterdir()) == []  # the copies are removed
    assert not log.exists() or log.read_text() == ""  # the stopped mutant is not logged


def listed_functions(args: list[str], capsys) -> set[str]:
    """The "path::function" of each mutant `python -m mutation --list *args` prints."""
    assert main(["--root", str(ROOT), "--list", "--kinds", "comparison", *args]) == 0
    return {line.split("#")[0] for line in capsys.readouterr().out.splitlines()}


def test_code_chooses_the_functions_mutated_and_a_target_is_found_in_either(capsys):
    forward = listed_functions(["--code", "forward"], capsys)
    assert "numpy_engine/softmax.py::softmax_last" in forward
    assert forward <= {f"{path}::{name}" for path, name in code_targets("forward")}
    backward = listed_functions([], capsys)  # --code backward, the default
    assert "numpy_engine/softmax.py::softmax_backward" in backward
    assert backward <= {f"{path}::{name}" for path, name in code_targets("backward")}
    found = listed_functions(["--target", "softmax_last", "softmax_backward"], capsys)
    assert found == {
        f"numpy_engine/softmax.py::{name}" for name in ("softmax_last", "softmax_backward")
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "no_such_backward"], "--target no_such_backward: not in mutation/targets.py"),
        (["--target", "numpy_engine/layers.py:no_such"], "has no function no_such"),
        (["--target", "numpy_engine/optim.py:_update_block"], "say which, as Class._update_block"),
        (["--jobs", "0"], "argument --jobs: must be a positive integer, got 0"),
        (["--code", "sideways"], "argument --code: invalid choice: 'sideways'"),
    ],
)
def test_a_bad_argument_is_refused_by_name(args, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--root", str(ROOT), "--list", *args])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err

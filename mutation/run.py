"""Run the tests against each mutant, on copies of the project, and report the survivors.

    python -m mutation                                   # all the backward code (hours)
    python -m mutation --code forward --kinds operator constant comparison negation deletion
    python -m mutation --target relu_backward gelu_backward --kinds operator constant
    python -m mutation --log mutants.jsonl               # kept; run it again to resume
    python -m mutation --list                            # the mutants, none run
    python -m mutation --ids survivors.txt               # these mutants again (their ids)

A mutant is killed when the tests fail against it (or run past the time limit), and
survives when they pass. A survivor is a change the tests cannot see: a gap in the tests,
or a change that computes the same thing (an equivalent mutant: swapaxes(-1, -2) made
swapaxes(-1, 2) on 4-D arrays, a branch for speed whose two paths agree), which only
reading it tells apart.

Each job works in its own copy of the project (made afresh in a temporary directory, without
.git, caches, runs or files over 50 MB), writes one mutant's file there, runs pytest on it
with -x, and puts the file back; the project itself is never written to. Bytecode is not
cached in the copies, so two mutants of one file never share a stale .pyc. Ctrl-C or
SIGTERM stops a run: the tests running then are ended (with whatever they started), the
copies removed, and the log keeps the mutants that finished.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from mutation.mutants import KINDS, Mutant, mutants, mutated_source
from mutation.processes import Running, stopped_by_sigterm
from mutation.targets import CODE, NUMBER_TESTS, code_targets

PYTEST = ("-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider")
NOT_COPIED = (".git", ".hypothesis", "__pycache__", "*.egg-info", ".*_cache", "runs", ".venv")
LARGEST_FILE_COPIED = 50 << 20  # bytes: not a downloaded model or a checkpoint, once per job
PRINT_ORIGINS = """import importlib.util, sys
for name in sys.argv[1:]:
    print(importlib.util.find_spec(name).origin)
"""
TIME_LIMIT_FACTOR, TIME_LIMIT_MIN = 5, 60  # a mutant's run may take this times the clean run's


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    root = args.root.resolve()
    try:
        ids = read_ids(args.ids) if args.ids else None
        targets = chosen_targets(args, ids, root)
        found = mutants(root, targets, args.kinds)
        if ids is not None:
            found = chosen_mutants(found, ids, args.ids)
        done = read_log(args.log)
    except (LookupError, OSError, SyntaxError, ValueError) as error:
        parser().error(str(error))
    if args.list:
        for mutant in sorted(found, key=lambda m: (m.path, m.line)):
            print(f"{mutant.id}  {mutant.describe()}")
        return 0
    to_run = [m for m in found if m.id not in done]
    print(f"{len(found)} mutants, {len(found) - len(to_run)} already in the log", file=sys.stderr)
    tests = shlex.split(args.tests)
    try:
        with stopped_by_sigterm():
            results = run_mutants(to_run, root, tests, args.jobs, args.log) if to_run else []
    except KeyboardInterrupt as stop:
        kept = f"; the mutants run so far are in {args.log}" if args.log else ""
        print(f"stopped{kept}", file=sys.stderr)
        return 128 + getattr(stop, "signal", signal.SIGINT)
    if results is None:
        return 1
    outcomes = {**done, **dict(results)}
    report([(m, outcomes[m.id]) for m in found])
    return 0


def run_mutants(to_run: list[Mutant], root: Path, tests: list[str], jobs: int, log: Path | None):
    """(id, result) of each mutant run, or None if the tests fail without a mutant."""
    with project_copies(root, jobs) as copies:
        check_imports_from(copies[0], sorted({m.path for m in to_run}))
        running = Running()  # every test run of this run, so that a stop can end them
        clean = run_tests(copies[0], tests, None, running)
        if clean.outcome != "survived":  # "survived": the tests pass
            print(f"the tests fail without any mutant:\n{clean.output}", file=sys.stderr)
            return None
        limit = max(TIME_LIMIT_MIN, TIME_LIMIT_FACTOR * clean.seconds)
        print(f"the tests pass unmutated in {clean.seconds:.0f} s", file=sys.stderr)
        return run_all(to_run, copies, tests, limit, log, running)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mutation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument(
        "--target",
        nargs="+",
        metavar="FUNCTION",
        help="the functions to mutate: a name from mutation/targets.py, or FILE:FUNCTION for "
        "any function (FUNCTION may be Class.method); default: all of --code",
    )
    chosen.add_argument(
        "--ids",
        type=Path,
        metavar="FILE",
        help="run only these mutants, one id a line: a line's first word, or its second after "
        "'survived', so --list's output and the report's survivors can be given as they are "
        "(blank lines and # comments skipped); the functions to mutate come from the ids",
    )
    parser.add_argument(
        "--code",
        choices=CODE,
        default="backward",
        help="without --target, the code to mutate: the backward functions of "
        "mutation/targets.py, or its forward functions (default: backward)",
    )
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=KINDS,
        default=list(KINDS),
        help="the kinds of mutant to make (see mutation/mutants.py; default: all)",
    )
    parser.add_argument(
        "--tests",
        default=" ".join(NUMBER_TESTS),
        help="the pytest arguments each mutant is run with, one string "
        "(default: the test files that check the engine's numbers)",
    )
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=os.cpu_count() or 1,
        help="mutants run at once, each in its own copy of the project (default: one a core)",
    )
    parser.add_argument(
        "--log",
        type=Path,
        help="a JSON-lines file, one line a mutant run; mutants already in it are not run "
        "again, so a run stopped part-way resumes",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path.cwd(),
        help="the project to copy and test (default: the current directory)",
    )
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    return parser


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def chosen_targets(args: argparse.Namespace, ids: list[str] | None, root: Path) -> list:
    """(file, function) pairs to mutate: those the ids name, --target's, or --code's."""
    if ids is not None:
        return sorted({tuple(mutant_id.split("#")[0].split("::", 1)) for mutant_id in ids})
    return resolve_targets(args.target, root) if args.target else code_targets(args.code)


def read_ids(path: Path) -> list[str]:
    """The mutant ids in the file --ids names (see its --help)."""
    ids = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = line.split()
        if words and words[0] == "survived":
            words = words[1:]
        if not words or words[0].startswith("#"):  # blank, or a comment
            continue
        if "::" not in words[0] or "#" not in words[0]:
            raise ValueError(f"--ids {path}:{number}: {words[0]!r} is not a mutant id")
        ids.append(words[0])
    if not ids:
        raise ValueError(f"--ids {path}: no mutant ids in it")
    return ids


def chosen_mutants(found: list[Mutant], ids: list[str], path: Path) -> list[Mutant]:
    """The mutants of found with the given ids; an id not among them is refused by name (its
    code has changed since the id was made, or --kinds leaves it out)."""
    by_id = {m.id: m for m in found}
    missing = [mutant_id for mutant_id in ids if mutant_id not in by_id]
    if missing:
        raise LookupError(
            f"--ids {path}: {missing[0]} is not a mutant of the code as it is now, or not of "
            f"--kinds ({len(missing)} of its ids are not)"
        )
    return [by_id[mutant_id] for mutant_id in dict.fromkeys(ids)]


def resolve_targets(names: list[str], root: Path) -> list[tuple[str, str]]:
    """(file, function) pairs, one for each name given: "FILE:FUNCTION", or a function of
    mutation/targets.py by name."""
    targets = []
    for name in names:
        if ":" in name:
            path, function = name.split(":", 1)
            if not (root / path).is_file():
                raise LookupError(f"--target {name}: no file {root / path}")
            targets.append((path, function))
            continue
        matches = [t for code in CODE for t in code_targets(code) if t[1] == name]
        if not matches:
            raise LookupError(f"--target {name}: not in mutation/targets.py; give FILE:{name}")
        targets += matches
    return targets


@dataclass(frozen=True)
class Result:
    outcome: str  # "killed", "timeout" or "survived" (the tests passed)
    seconds: float
    output: str  # pytest's, or the last line of it when read from a log

    def last_line(self) -> str:
        lines = self.output.strip().splitlines()
        return lines[-1] if lines else ""


@contextlib.contextmanager
def project_copies(root: Path, n: int) -> Iterator[list[Path]]:
    """n copies of root, in a temporary directory removed after."""
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        copies = [Path(tmp) / f"copy{i}" for i in range(n)]
        for path in copies:
            shutil.copytree(root, path, ignore=not_copied, symlinks=True)
        yield copies


def check_imports_from(copy: Path, paths: list[str]) -> None:
    """Stop unless the tests, run in copy, would import each target file from copy itself (an
    installed package found first would hide every mutant: all would survive)."""
    modules = [".".join(Path(path).with_suffix("").parts) for path in paths]
    done = subprocess.run(
        [sys.executable, "-c", PRINT_ORIGINS, *modules],
        cwd=copy,
        env=isolated_environment(copy),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"cannot import the targets in a copy of the project:\n{done.stderr}")
    for path, origin in zip(paths, done.stdout.splitlines(), strict=True):
        if Path(origin).resolve() != (copy / path).resolve():
            raise SystemExit(f"the tests would import {path} from {origin}, not from the copy")


def isolated_environment(copy: Path) -> dict[str, str]:
    """os.environ with copy first on the import path and no bytecode written."""
    path = os.pathsep.join(p for p in (str(copy), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def not_copied(directory: str, names: list[str]) -> set[str]:
    """copytree's ignore: caches, runs, environments, and files past LARGEST_FILE_COPIED."""
    skipped = set(shutil.ignore_patterns(*NOT_COPIED)(directory, names))
    for name in set(names) - skipped:
        path = Path(directory) / name
        if path.is_file() and path.stat().st_size > LARGEST_FILE_COPIED:
            skipped.add(name)
    return skipped


def run_all(to_run, copies: list[Path], tests, limit, log, running: Running) -> list:
    """(id, result) of each mutant, in the order they finish; a line each on stderr and in
    log. A job takes a free copy from a queue and puts it back; on Ctrl-C or SIGTERM the
    tests running are ended and the mutants not yet started dropped (the log keeps those
    done)."""
    free: queue.Queue[Path] = queue.Queue()
    for copy in copies:
        free.put(copy)
    pool = ThreadPoolExecutor(len(copies))
    results = []
    try:
        futures = {pool.submit(run_mutant, m, free, tests, limit, running): m for m in to_run}
        for n, future in enumerate(as_completed(futures), 1):
            mutant, result = futures[future], future.result()
            results.append((mutant.id, result))
            print(f"[{n}/{len(to_run)}] {result.outcome:8} {mutant.describe()}", file=sys.stderr)
            if log is not None:
                append_log(log, mutant, result)
    finally:
        running.stop()  # on a stop, the tests running now: else the pool would wait for them
        pool.shutdown(cancel_futures=True)
    return results


def run_mutant(mutant: Mutant, free: queue.Queue, tests, limit: float, running) -> Result:
    """Write the mutant into a free copy, run the tests there, put the file back. The mutant
    is made from the copy's file, not the project's: the project may be edited while a run
    goes on, and the copies keep the code the run started from."""
    copy = free.get()
    path = copy / mutant.path
    original = path.read_text()
    try:
        path.write_text(mutated_source(original, mutant))
        return run_tests(copy, tests, limit, running)
    finally:
        path.write_text(original)
        free.put(copy)


def run_tests(copy: Path, tests: list[str], timeout: float | None, running: Running) -> Result:
    """pytest in copy, its code first on the path; "killed" when it fails or runs past timeout."""
    start = time.perf_counter()
    process = running.start(
        [sys.executable, *PYTEST, *tests],
        cwd=copy,
        env=isolated_environment(copy),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        output = None
    finally:
        running.end(process)  # ends it if it is still running: past the timeout, or a stop
    if output is None:
        process.communicate()  # collect it
        return Result("timeout", time.perf_counter() - start, f"ran past {timeout:.0f} s")
    outcome = "survived" if process.returncode == 0 else "killed"
    return Result(outcome, time.perf_counter() - start, output)


def read_log(log: Path | None) -> dict[str, Result]:
    """The results already in log, by mutant id ({} without a log or before its first line)."""
    if log is None or not log.exists():
        return {}
    results = {}
    for number, line in enumerate(log.read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
            results[entry["id"]] = Result(entry["outcome"], entry["seconds"], entry["last"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{log}:{number} is not a line this tool wrote: {line[:80]}") from None
    return results


def append_log(log: Path, mutant: Mutant, result: Result) -> None:
    entry = {
        "id": mutant.id,
        "outcome": result.outcome,
        "seconds": round(result.seconds, 1),
        "mutant": mutant.describe(),
        "last": result.last_line(),
    }
    with open(log, "a") as file:
        file.write(json.dumps(entry) + "\n")


def report(outcomes: list[tuple[Mutant, Result]]) -> None:
    """The survivors, each with its change, then one line of counts (on stdout)."""
    survived = (m for m, r in outcomes if r.outcome == "survived")
    survivors = sorted(survived, key=lambda m: (m.path, m.line))
    for mutant in survivors:
        print(f"survived  {mutant.id}  {mutant.describe()}")
    counts = {kind: sum(r.outcome == kind for _, r in outcomes) for kind in ("killed", "timeout")}
    print(
        f"{len(outcomes)} mutants: {counts['killed']} killed, {counts['timeout']} timed out, "
        f"{len(survivors)} survived"
    )

"""Each package has one role, and its imports show it (read statically, nothing is run):

numpy_engine     the engine: numpy and the standard library (optional extras lazily)
torch_reference  the witness: the same models in PyTorch, never the engine's code
crosscheck       the glue: moves weights across, compares, reports; imports both
benchmarks       every benchmark: workloads, train step, generation, the matmul floor
mutation         the check of the checks: breaks the engine's code on a copy, runs the tests;
                 it never imports the code it breaks (each mutant runs in its own process)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = {
    "numpy_engine",
    "torch_reference",
    "crosscheck",
    "benchmarks",
    "mutation",
    "parity_tests",
}
MAY_NOT_IMPORT = {
    "numpy_engine": {"torch", "torch_reference", "crosscheck", "benchmarks", "parity_tests"},
    "torch_reference": {"numpy_engine", "crosscheck", "benchmarks", "parity_tests"},
    "crosscheck": {"parity_tests"},
    "benchmarks": {"parity_tests"},
    "mutation": {
        "numpy_engine",
        "torch",
        "torch_reference",
        "crosscheck",
        "benchmarks",
        "parity_tests",
    },
}
OPTIONAL_EXTRAS = {"matplotlib", "mpi4py", "safetensors", "threadpoolctl", "tokenizers"}


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(top-level packages imported anywhere in the file, those imported at module level)."""
    tree = ast.parse(path.read_text())
    anywhere, top = set(), set()
    for node in ast.walk(tree):
        names = set()
        if isinstance(node, ast.Import):
            names = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = {node.module.split(".")[0]}
        anywhere |= names
        if node in tree.body:
            top |= names
    return anywhere, top


@pytest.mark.parametrize("package", list(MAY_NOT_IMPORT))
def test_each_package_imports_only_what_its_role_allows(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no package {package}"
    for path in files:
        anywhere, _ = imports(path)
        forbidden = anywhere & MAY_NOT_IMPORT[package]
        assert not forbidden, f"{package}/{path.name} imports {sorted(forbidden)}"


def test_the_engine_imports_numpy_the_standard_library_and_itself_at_module_level():
    allowed = {"numpy", "numpy_engine", "__future__"} | set(sys.stdlib_module_names)
    for path in sorted((ROOT / "numpy_engine").rglob("*.py")):
        anywhere, top = imports(path)
        assert top <= allowed, f"numpy_engine/{path.name} imports {sorted(top - allowed)}"
        lazy = anywhere - allowed - PROJECT
        assert lazy <= OPTIONAL_EXTRAS, f"numpy_engine/{path.name} imports {sorted(lazy)}"


def test_every_package_is_installed_with_the_project():
    text = (ROOT / "pyproject.toml").read_text()
    for package in MAY_NOT_IMPORT:
        for path in (ROOT / package).rglob("__init__.py"):
            name = ".".join(path.parent.relative_to(ROOT).parts)
            assert f'"{name}"' in text, f"{name} is not in pyproject's packages"


# ------------------------------------------- a model kind is told apart by asking, nowhere else

REGISTRY = ROOT / "numpy_engine" / "models"  # where each kind describes itself


def kind_tests(path: Path, kinds: set[str], classes: set[str]) -> list[str]:
    """Lines of path that compare with a kind's name or call isinstance with a model class."""
    found, where = [], path.relative_to(ROOT) if ROOT in path.parents else path.name
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value in kinds for o in operands):
                found.append(f"{where}:{node.lineno} compares with a kind name")
        is_isinstance = isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance"
        if is_isinstance and len(node.args) == 2:
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if named & classes:
                found.append(f"{where}:{node.lineno} isinstance of a model")
    return found


def test_no_code_outside_the_registry_branches_on_a_model_kind():
    from numpy_engine.models import KINDS

    kinds = set(KINDS)
    classes = {cls.__name__ for cls in KINDS.values()} | {"Model"}
    everywhere = [ROOT / name for name in sorted(PROJECT) + ["examples"]]
    files = [p for d in everywhere for p in d.rglob("*.py") if REGISTRY not in p.parents]
    assert len(files) > 50
    found = [line for path in files for line in kind_tests(path, kinds, classes)]
    assert not found, "\n".join(found)


def test_the_kind_check_finds_what_it_looks_for(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text('if model.kind == "gpt" or isinstance(model, ne.MiniGPT):\n    pass\n')
    found = kind_tests(path, {"gpt"}, {"MiniGPT"})
    assert [line.split()[-1] for line in found] == ["name", "model"], found

"""Each package has one role, and its imports show it (read statically, nothing is run):

numpy_engine     the engine: numpy and the standard library (optional extras lazily)
torch_reference  the witness: the same models in PyTorch, never the engine's code
crosscheck       the glue: moves weights across, compares, reports; imports both
benchmarks       every benchmark: workloads, train step, generation, the matmul floor
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = {"numpy_engine", "torch_reference", "crosscheck", "benchmarks", "parity_tests"}
MAY_NOT_IMPORT = {
    "numpy_engine": {"torch", "torch_reference", "crosscheck", "benchmarks", "parity_tests"},
    "torch_reference": {"numpy_engine", "crosscheck", "benchmarks", "parity_tests"},
    "crosscheck": {"parity_tests"},
    "benchmarks": {"parity_tests"},
}
OPTIONAL_EXTRAS = {"matplotlib"}  # imported inside the functions that need them


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
    files = sorted((ROOT / package).glob("*.py"))
    assert files, f"no package {package}"
    for path in files:
        anywhere, _ = imports(path)
        forbidden = anywhere & MAY_NOT_IMPORT[package]
        assert not forbidden, f"{package}/{path.name} imports {sorted(forbidden)}"


def test_the_engine_imports_numpy_the_standard_library_and_itself_at_module_level():
    allowed = {"numpy", "numpy_engine", "__future__"} | set(sys.stdlib_module_names)
    for path in sorted((ROOT / "numpy_engine").glob("*.py")):
        anywhere, top = imports(path)
        assert top <= allowed, f"numpy_engine/{path.name} imports {sorted(top - allowed)}"
        lazy = anywhere - allowed - PROJECT
        assert lazy <= OPTIONAL_EXTRAS, f"numpy_engine/{path.name} imports {sorted(lazy)}"


def test_every_package_is_installed_with_the_project():
    text = (ROOT / "pyproject.toml").read_text()
    for package in MAY_NOT_IMPORT:
        assert f'"{package}"' in text, f"{package} is not in pyproject's packages"

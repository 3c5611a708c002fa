"""The mutants: one small change each to a target function, made on its syntax tree.

Arithmetic and logic, the mistakes a derivation makes:
- operator:   + <-> -, * <-> / (in an expression or an augmented assignment)
- constant:   an int n -> n + 1, a float x -> 2 x (0.0 -> 1.0)
- comparison: < <-> <=, > <-> >=, == <-> !=, in <-> not in, is <-> is not
- negation:   -x -> +x, not x -> not not x (the condition inverted)
- deletion:   an augmented assignment (x += y) or a statement that is a call -> pass

Wiring, the mistakes a backward's plumbing makes (a backward that is a list of calls has no
arithmetic to break):
- name:       a variable read -> one of the three nearest variables of the same role defined
              on an earlier line (roles: gradients d*, grads dicts *grads, caches *cache*,
              other values)
- attribute:  a field read from a variable -> a sibling field read from it in the same
              function (cache.ln1 -> cache.ln2)
- swap:       two adjacent call arguments that are different variables of the same role,
              exchanged

Raise statements, assertions, f-strings and docstrings are not mutated: they word errors.
Nor is the 1 of reshape(-1): NumPy reads reshape(-2) as the same call.
A mutant is named by its file, its function, its index among that function's sites and a
digest of its change: a log of results (run.py) never applies to code that has changed.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

KINDS = (
    "operator",
    "constant",
    "comparison",
    "negation",
    "deletion",
    "name",
    "attribute",
    "swap",
)
OPERATORS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
COMPARISONS = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
NEAREST_NAMES, SIBLING_FIELDS = 3, 4  # alternatives per variable read, per field read


@dataclass(frozen=True)
class Mutant:
    path: str  # the file, relative to the project's root
    function: str
    index: int  # among the function's sites, in the order sites() yields them
    kind: str
    line: int  # in the unmutated file
    before: str  # the statement changed, as it was (unparsed: one line)
    after: str  # and as the mutant has it

    @property
    def id(self) -> str:
        """Unique and stable: the change's own digest makes a mutant of edited code new."""
        change = hashlib.sha1(f"{self.kind}\n{self.before}\n{self.after}".encode()).hexdigest()
        return f"{self.path}::{self.function}#{self.index}-{change[:8]}"

    def describe(self) -> str:
        where = f"{self.path}:{self.line} {self.function} ({self.kind})"
        return f"{where}: {self.before}  ->  {self.after}"


@dataclass(frozen=True)
class Site:
    node: ast.AST  # what changes: an expression, a statement (deletion) or a call (swap)
    kind: str
    alternative: str | int | None = None  # a name, a field or an argument index


def mutants(
    root: Path, targets: list[tuple[str, str]], kinds: Collection[str] = KINDS
) -> list[Mutant]:
    """Every mutant of the given kinds of the target functions, (file relative to root,
    function name) each. Only those are described: describing one parses its file again."""
    found = []
    for path, function in targets:
        source = (root / path).read_text()
        for index, site in enumerate(sites(find_function(ast.parse(source), function, path))):
            if site.kind in kinds:
                found.append(describe(source, path, function, index))
    return found


def mutated_source(source: str, mutant: Mutant) -> str:
    """The mutant's whole file, from source (the file's text): parsed afresh, changed at its
    site, unparsed (comments and layout are lost; the code is the same but for the one
    change)."""
    tree = ast.parse(source)
    apply(find_function(tree, mutant.function, mutant.path), mutant.index)
    return ast.unparse(tree)


def describe(source: str, path: str, function: str, index: int) -> Mutant:
    """The mutant at site index of function: its line and the statement before and after."""
    tree = ast.parse(source)
    node = find_function(tree, function, path)
    before = ast.unparse(node).splitlines()
    site = apply(node, index)
    diff = list(difflib.ndiff(before, ast.unparse(node).splitlines()))
    removed = [line[2:] for line in diff if line.startswith("- ")]
    added = [line[2:] for line in diff if line.startswith("+ ")]
    return Mutant(
        path,
        function,
        index,
        site.kind,
        getattr(site.node, "lineno", node.lineno),
        " / ".join(line.strip() for line in removed),
        " / ".join(line.strip() for line in added),
    )


def find_function(tree: ast.AST, name: str, path: str) -> ast.FunctionDef:
    """The function called name in tree: "function", or "Class.method". A bare name must be
    the only function of that name in the file (else say which class's)."""
    *owner, function = name.split(".")
    scopes = [tree]
    if owner:
        scopes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == owner[0]]
    found = [
        node
        for scope in scopes
        for node in (ast.walk(scope) if not owner else scope.body)
        if isinstance(node, ast.FunctionDef) and node.name == function
    ]
    if not found:
        raise LookupError(f"{path} has no function {name}")
    if len(found) > 1:
        raise LookupError(f"{path} has {len(found)} functions {name}: say which, as Class.{name}")
    return found[0]


def apply(function: ast.FunctionDef, index: int) -> Site:
    """Make the change of the function's site number index, in place; returns the site."""
    site = list(sites(function))[index]
    node = site.node
    if site.kind == "operator":
        node.op = OPERATORS[type(node.op)]()
    elif site.kind == "constant":
        node.value = node.value + 1 if isinstance(node.value, int) else node.value * 2 or 1.0
    elif site.kind == "comparison":
        node.ops[0] = COMPARISONS[type(node.ops[0])]()
    elif site.kind == "negation" and isinstance(node.op, ast.Not):
        node.operand = ast.UnaryOp(ast.Not(), node.operand)
    elif site.kind == "negation":
        node.op = ast.UAdd()
    elif site.kind == "deletion":
        body, position = _statement_lists(function)[id(node)]
        body[position] = ast.copy_location(ast.Pass(), node)
    elif site.kind == "name":
        node.id = site.alternative
    elif site.kind == "attribute":
        node.attr = site.alternative
    else:  # swap
        i = site.alternative
        node.args[i], node.args[i + 1] = node.args[i + 1], node.args[i]
    return site


def sites(function: ast.FunctionDef) -> Iterator[Site]:
    """The function's mutable sites, in a fixed order (ast.walk's, then the kinds' order)."""
    unmutated = _wording(function) | _same_program(function)
    called = {id(node.func) for node in ast.walk(function) if isinstance(node, ast.Call)}
    defined = _defined_lines(function)
    fields = _fields_read(function, defined, called)
    statements = _statement_lists(function)
    for node in ast.walk(function):
        if id(node) in unmutated:
            continue
        yield from _arithmetic_sites(node, statements)
        if id(node) not in called:
            yield from _wiring_sites(node, defined, fields)


def _arithmetic_sites(node: ast.AST, statements: dict) -> Iterator[Site]:
    if isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in OPERATORS:
        yield Site(node, "operator")
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
        yield Site(node, "constant")  # type(True) is bool: True and False are not numbers here
    elif isinstance(node, ast.Compare) and type(node.ops[0]) in COMPARISONS:
        yield Site(node, "comparison")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.Not):
        yield Site(node, "negation")
    is_call = isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
    if id(node) in statements and (isinstance(node, ast.AugAssign) or is_call):
        yield Site(node, "deletion")


def _wiring_sites(node: ast.AST, defined: dict, fields: dict) -> Iterator[Site]:
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in defined:
        for name in _nearest_of_role(node.id, node.lineno, defined):
            yield Site(node, "name", name)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        siblings = sorted(fields.get(node.value.id, set()) - {node.attr})
        for field in siblings[:SIBLING_FIELDS]:
            yield Site(node, "attribute", field)
    if isinstance(node, ast.Call):
        args = node.args
        for i in range(len(args) - 1):
            a, b = args[i], args[i + 1]
            names = isinstance(a, ast.Name) and isinstance(b, ast.Name)
            if names and a.id != b.id and role(a.id) == role(b.id):  # f(x, x) swapped is f(x, x)
                yield Site(node, "swap", i)


def role(name: str) -> str:
    """What a variable holds, by this project's naming: gradients d<name>, a grads dict
    <...>grads, a cache <...>cache<...>, or another value."""
    if name.endswith("grads"):
        return "grads"
    if name.startswith("d") and len(name) > 1:
        return "gradient"
    if "cache" in name:
        return "cache"
    return "value"


def _nearest_of_role(name: str, line: int, defined: dict[str, int]) -> list[str]:
    """Up to NEAREST_NAMES variables of name's role defined before line, the latest first
    (one assigned on line itself holds no value yet where line reads)."""
    others = [n for n, at in defined.items() if n != name and at < line and role(n) == role(name)]
    return sorted(others, key=lambda n: -defined[n])[:NEAREST_NAMES]


def _defined_lines(function: ast.FunctionDef) -> dict[str, int]:
    """Each argument and assigned variable (not self): the first line it holds a value."""
    defined = {arg.arg: function.lineno for arg in function.args.args}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.setdefault(node.id, node.lineno)
    defined.pop("self", None)
    return defined


def _fields_read(function: ast.FunctionDef, defined: dict, called: set) -> dict[str, set]:
    """The fields read from each variable (variable.field, not a method call)."""
    fields: dict[str, set] = {}
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in defined
            and id(node) not in called
        ):
            fields.setdefault(node.value.id, set()).add(node.attr)
    return fields


def _statement_lists(function: ast.FunctionDef) -> dict[int, tuple[list, int]]:
    """id(statement): (the list of statements it is in, its position there)."""
    where = {}
    for node in ast.walk(function):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list):
                where.update({id(s): (body, i) for i, s in enumerate(body)})
    return where


def _same_program(function: ast.FunctionDef) -> set[int]:
    """ids of constants whose mutant is known to compute the same: the 1 of reshape(-1)
    (NumPy reads any negative size as "infer": reshape(-2) is the same call)."""
    same = set()
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "reshape"
        ):
            for arg in node.args:
                if isinstance(arg, ast.UnaryOp) and isinstance(arg.op, ast.USub):
                    same.add(id(arg.operand))
    return same


def _wording(function: ast.FunctionDef) -> set[int]:
    """ids of the nodes that word errors or documentation: never mutated."""
    skipped = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Raise | ast.Assert | ast.JoinedStr):
            skipped |= {id(n) for n in ast.walk(node)}
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        skipped |= {id(n) for n in ast.walk(first)}  # the docstring
    return skipped

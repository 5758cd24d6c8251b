"""Issue #52: modules a maintainer can read. Every module of a checked package (migrations aside) holds at most
``MAX_MODULE_LINES`` lines, every function at most ``MAX_FUNCTION_LINES`` (``def`` to its last line) and a McCabe
complexity of at most ``MAX_COMPLEXITY``.

Complexity is 1 plus the decisions in the function's own body (a nested function or class is measured by itself):
``if``/``elif``, ``for``, ``while``, each ``except``, each extra operand of ``and``/``or``, each ``if`` of a
comprehension, a conditional expression, each ``case`` of a ``match`` -- stricter than ruff's C901, which does not
count boolean operators. The scan reads the files with ``ast``; nothing is imported.

``CHECKED`` lists what is held to the limits so far: flows/ since it was split into decide, store and execute, the
decision's pure module, and tenants/ and accounts/, which fit as they are. Add a package here once it fits (the aim
is every first-party package, ``tests.support.project.first_party_packages``).
``python tests/unit/test_module_limits.py flows runtime`` prints the figures of any package.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
MAX_COMPLEXITY = 15
#: Packages (directories) or single modules held to the limits, relative to the repository.
CHECKED = ["flows", "runtime/flow_plan.py", "tenants", "accounts"]

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def modules(target: str) -> list[Path]:
    path = ROOT / target
    found = [path] if path.is_file() else sorted(path.rglob("*.py"))
    return [p for p in found if "migrations" not in p.relative_to(ROOT).parts]


def complexity(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """McCabe's number of the function's own body (its nested functions and classes are not counted here)."""
    count = 1
    todo: list[ast.AST] = [*function.body]
    while todo:
        node = todo.pop()
        if isinstance(node, _SCOPES):
            continue
        if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.IfExp, ast.match_case)):
            count += 1
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            count += 1 + len(node.ifs)
        todo.extend(ast.iter_child_nodes(node))
    return count


def functions(path: Path) -> Iterator[tuple[str, int, int, int]]:
    """``(qualified name, line, length in lines, complexity)`` of every function and method of a module."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child.lineno, (child.end_lineno or child.lineno) - child.lineno + 1, complexity(child)
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(path.read_text(encoding="utf-8")), "")


def offences(target: str) -> list[str]:
    found = []
    for path in modules(target):
        where = path.relative_to(ROOT)
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{where}: {lines} lines (at most {MAX_MODULE_LINES})")
        for name, line, length, cc in functions(path):
            if length > MAX_FUNCTION_LINES:
                found.append(f"{where}:{line}: {name} is {length} lines long (at most {MAX_FUNCTION_LINES})")
            if cc > MAX_COMPLEXITY:
                found.append(f"{where}:{line}: {name} has complexity {cc} (at most {MAX_COMPLEXITY})")
    return found


@pytest.mark.parametrize("target", CHECKED)
def test_modules_and_functions_stay_within_their_limits(target: str) -> None:
    assert modules(target), f"{target}: nothing to check"
    assert offences(target) == []


def test_the_measure_counts_what_it_says() -> None:
    source = '''
def f(xs, a, b):
    """A docstring."""
    if a and b or not a:          # if: 1, and/or: 2
        return [x for x in xs if x]  # a comprehension and its if: 2
    for x in xs:                  # 1
        try:
            pass
        except ValueError:        # 1
            pass
    def g():                      # measured by itself
        if a:
            pass
    return 1 if a else 2          # 1
'''
    tree = ast.parse(source)
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    assert complexity(function) == 1 + 3 + 2 + 1 + 1 + 1
    inner = function.body[3]
    assert isinstance(inner, ast.FunctionDef) and complexity(inner) == 2


if __name__ == "__main__":  # the figures: each module's lines, its longest and most complex functions
    for target in sys.argv[1:] or CHECKED:
        for path in modules(target):
            measured = list(functions(path))
            longest = max(measured, key=lambda f: f[2], default=("-", 0, 0, 0))
            knottiest = max(measured, key=lambda f: f[3], default=("-", 0, 0, 0))
            print(f"{path.relative_to(ROOT)}: {len(path.read_text(encoding='utf-8').splitlines())} lines; longest "
                  f"{longest[0]} {longest[2]}; most complex {knottiest[0]} {knottiest[3]}")

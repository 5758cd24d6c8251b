"""Count imports between the project's apps: app-to-app edges each way, function-local imports, cycles.

    python scripts/import_stats.py            # a table
    python scripts/import_stats.py --json     # the same figures as JSON (the #12 closing note quotes them)

Read with `ast`, nothing is imported. Migrations are left out (Django writes them).
"""

from __future__ import annotations

import ast
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The roof, the composition root: it wires every layer together from above them all (see .importlinter).
ROOT_PACKAGE = "config"


def _first_party_packages() -> tuple[str, ...]:
    """INSTALLED_APPS' entries that are top-level packages here, read from config/settings.py (nothing imported), and
    the plain packages beside them (core, runtime, llm, egress): never a hand-written list, which missed flows and
    releases. tests/unit/test_project_packages.py holds this to Django's own app registry."""
    tree = ast.parse((ROOT / "config" / "settings.py").read_text())
    installed = next(ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                     and any(getattr(target, "id", None) == "INSTALLED_APPS" for target in node.targets))
    apps = {name for name in installed if (ROOT / name / "__init__.py").is_file()}
    plain = {path.parent.name for path in ROOT.glob("*/__init__.py") if path.parent.name != "tests"}
    return tuple(sorted(apps | plain))


APPS = _first_party_packages()


def _app_of(module: str) -> str | None:
    head = module.split(".", 1)[0]
    return head if head in APPS else None


def _files():
    for app in APPS:
        base = ROOT / app
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            if "migrations" in path.parts:
                continue
            yield app, path


def _imports(tree: ast.AST):
    """(module, local) for each import; local is True inside a function body."""
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                out.extend((alias.name, local) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                out.append((child.module, local))
            elif (isinstance(child, ast.Call) and getattr(child.func, "id", None) in ("__import__", "import_module")
                  and child.args and isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str)):
                out.append((child.args[0].value, True))
            visit(child, inner)

    visit(tree, False)
    return out


def stats() -> dict:
    edges: Counter[tuple[str, str]] = Counter()
    local_total = 0
    local_cross = 0
    dynamic = 0
    root_edges: Counter[tuple[str, str]] = Counter()
    for app, path in _files():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_root = app == ROOT_PACKAGE
        for module, local in _imports(tree):
            target = _app_of(module)
            if local and target is not None:
                local_total += 1
            if target is None or target == app:
                continue
            if is_root:
                root_edges[(app, target)] += 1
                continue
            edges[(app, target)] += 1
            if local:
                local_cross += 1
    pairs = {}
    for (a, b), n in sorted(edges.items()):
        pairs[f"{a}->{b}"] = n
    cycles = sorted({tuple(sorted((a, b))) for (a, b) in edges if (b, a) in edges})
    return {
        "app_to_app_imports": pairs,
        "two_way_pairs": [f"{a}<->{b}" for a, b in cycles],
        "composition_root_imports": {f"{a}->{b}": n for (a, b), n in sorted(root_edges.items())},
        "function_local_project_imports": local_total,
        "function_local_cross_app_imports": local_cross,
        "dynamic_imports": dynamic,
    }


def main() -> int:
    figures = stats()
    if "--json" in sys.argv:
        print(json.dumps(figures, indent=2))
        return 0
    for pair, n in figures["app_to_app_imports"].items():
        print(f"{pair:28} {n}")
    print("two-way pairs:", ", ".join(figures["two_way_pairs"]) or "none")
    print("composition root (config/):",
          ", ".join(f"{k} {v}" for k, v in figures["composition_root_imports"].items()) or "none")
    print("function-local project imports:", figures["function_local_project_imports"])
    print("  of them across apps:", figures["function_local_cross_app_imports"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

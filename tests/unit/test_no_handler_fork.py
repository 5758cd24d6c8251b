"""Issue #51: HTTP is served by Django's own handlers. No module of the project subclasses a Django request handler
(``django.core.handlers.base.BaseHandler``: the ASGI and WSGI handlers) to replace a step of its request lifecycle;
what is ours wraps the handler as plain ASGI middleware (config/asgi.py, docs/decisions/server-layout.md).

``config`` (where the server is composed) and ``core`` (the ASGI middleware it stacks) are imported and their classes
inspected; every other module of the project is read, not imported (some modules change the process when imported,
e.g. a tool's isolated child), for a class whose bases name a Django handler."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

from django.apps import apps
from django.core.handlers.base import BaseHandler

ROOT = Path(__file__).resolve().parents[2]
#: The request lifecycle of Django's handlers: a subclass restating one is a fork of Django's internals.
LIFECYCLE = {"__call__", "handle", "get_response", "get_response_async", "load_middleware", "adapt_method_mode",
             "run_get_response", "send_response", "create_request", "read_body", "listen_for_disconnect",
             "_get_response", "_get_response_async"}


def _project_packages() -> list[str]:
    names = {config.name.split(".")[0] for config in apps.get_app_configs() if (ROOT / config.name.split(".")[0]).is_dir()}
    return sorted(names | set(COMPOSED))


HANDLERS = {"BaseHandler", "ASGIHandler", "WSGIHandler"}
#: The packages imported whole: the roof, where the server is composed, and the cellar its middleware comes from.
COMPOSED = ("config", "core")


def _import_composed() -> None:
    for package in COMPOSED:
        root = importlib.import_module(package)
        for module in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            importlib.import_module(module.name)


def _handler_subclasses_in_source(package: str) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
                if bases & HANDLERS:
                    found.append(f"{path.relative_to(ROOT)}: class {node.name}({', '.join(sorted(bases))})")
    return found


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_no_project_module_subclasses_a_django_handler_to_replace_its_lifecycle() -> None:
    packages = _project_packages()
    assert {"config", "core", "agents"} <= set(packages), packages
    _import_composed()
    forks = sorted(f"{cls.__module__}.{cls.__qualname__} restates {sorted(LIFECYCLE & set(vars(cls)))}"
                   for cls in _subclasses(BaseHandler)
                   if cls.__module__.split(".")[0] in packages and LIFECYCLE & set(vars(cls)))
    assert not forks, "serve HTTP with Django's own handler, wrapped by ASGI middleware:\n" + "\n".join(forks)
    in_source = [found for package in packages for found in _handler_subclasses_in_source(package)]
    assert not in_source, "serve HTTP with Django's own handler, wrapped by ASGI middleware:\n" + "\n".join(in_source)

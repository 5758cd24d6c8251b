"""Issue #51: HTTP is served by Django's own handlers. No module of the project subclasses a Django request handler
(``django.core.handlers.base.BaseHandler``: the ASGI and WSGI handlers) to replace a step of its request lifecycle;
what is ours wraps the handler as plain ASGI middleware (config/asgi.py, docs/decisions/server-layout.md)."""

from __future__ import annotations

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
    return sorted(names | {"config"})


def _import_everything(package: str) -> None:
    root = importlib.import_module(package)
    for module in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if ".migrations" not in module.name and ".tests" not in module.name:
            importlib.import_module(module.name)


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_no_project_module_subclasses_a_django_handler_to_replace_its_lifecycle() -> None:
    packages = _project_packages()
    assert "config" in packages and "agents" in packages, packages
    for package in packages:
        _import_everything(package)
    forks = sorted(f"{cls.__module__}.{cls.__qualname__} restates {sorted(LIFECYCLE & set(vars(cls)))}"
                   for cls in _subclasses(BaseHandler)
                   if cls.__module__.split(".")[0] in packages and LIFECYCLE & set(vars(cls)))
    assert not forks, "serve HTTP with Django's own handler, wrapped by ASGI middleware:\n" + "\n".join(forks)

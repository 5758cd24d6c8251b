"""Issue #51: the app obeys the framework. No first-party module flips Django's connection state, builds a model
instance past its constructor, imports the ORM's SQL internals, subclasses a framework handler, middleware or
database backend to restate the method that does its work, or reads or assigns a private attribute (a leading
underscore) of a framework's or library's object.

Why: each of these is pinned to one Django (or django-csp, DRF, Channels) release's private behaviour, breaks
silently on an upgrade, and is what a maintainer rejects on sight. Speed is bought by public means instead
(docs/decisions/). The scan reads every first-party package (each top-level directory with an ``__init__.py``; not
the tests, the benchmarks or the virtualenv) with ``ast``, so comments and docstrings that name these things do not
count, and a failure lists every offence it found as ``path:line: what``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import pathlib
import re
import sys
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOT_APP_CODE = {"tests", "bench", ".venv", "var", "node_modules"}

#: Known offenders (path -> why it is still here): none since issue #51 removed the handler fork and the compiled
#: reads. Nothing may be added to it; a listed file that no longer offends fails
#: ``test_the_allow_list_names_only_files_that_still_offend`` so the list cannot go stale.
ALLOWED: dict[str, str] = {}

#: Django's connection state (``BaseDatabaseWrapper``): only ``transaction.atomic()``/``set_autocommit`` change it.
CONNECTION_STATE = {"in_atomic_block", "needs_rollback", "autocommit", "savepoint_ids", "savepoint_state",
                    "run_on_commit", "commit_on_exit", "closed_in_transaction", "run_commit_hooks_on_set_autocommit_on"}
#: The ORM's internals: how querysets become SQL and instances (public API: QuerySet, Q, F, expressions, lookups).
ORM_INTERNALS = ("django.db.models.sql", "django.db.models.query_utils")
#: Packages whose handlers, middleware and database backends the app uses as shipped.
FRAMEWORKS = ("django", "rest_framework", "channels", "csp", "daphne", "uvicorn", "whitenoise")
#: The methods that do a handler's, a middleware's or a backend's work: restating one forks the framework.
WORK_METHODS = {"handle", "get_response", "get_response_async", "load_middleware", "process_request", "process_view",
                "process_response", "process_exception", "__call__", "__acall__", "create_cursor", "get_new_connection",
                "init_connection_state", "get_connection_params"}
#: Private attributes of library objects that first-party code read or assigned to win CPU (issue #51): channels_redis's
#: layer (the restated ``group_send`` of core/redis_layer.py), Django's Redis cache client and cache (config/cache.py),
#: an HTTP response's closers (agents/sse.py), a cache backend's client, a model's ``_state.fields_cache`` (the
#: relation cache; set a relation through its descriptor, ask ``Model.relation.is_cached``). Flagged on any object
#: but a class's own ``self``/``cls``; on those, in a subclass of a library class, whatever private the library class has (read from
#: the installed library: :func:`library_privates`) is flagged, and these when it cannot be imported here.
LIBRARY_PRIVATES = {"_group_key", "_map_channel_keys_to_connection", "_class", "_client", "_get_connection_pool",
                    "_get_connection_pool_index", "_resource_closers", "_cache", "_get_client", "fields_cache"}
#: Stdlib-and-builtins top-level modules: not "libraries" for the private-attribute check (threading's, logging's).
STDLIB = set(sys.stdlib_module_names) | {"builtins", "__future__", "typing_extensions"}


@functools.lru_cache(maxsize=1)
def first_party() -> frozenset[str]:
    return frozenset(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def app_files() -> Iterator[pathlib.Path]:
    for package in sorted(ROOT.iterdir()):
        if package.is_dir() and package.name not in NOT_APP_CODE and (package / "__init__.py").exists():
            yield from sorted(package.rglob("*.py"))


def _imports(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (``from a.b import C`` -> ``C: a.b.C``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr, imports: dict[str, str]) -> str:
    """A base class expression as the dotted name it resolves to through the module's imports ("" if it cannot)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([imports.get(node.id, node.id), *reversed(parts)])


def _is_framework_machinery(dotted: str) -> bool:
    name = dotted.rsplit(".", 1)[-1]
    return (dotted.split(".", 1)[0] in FRAMEWORKS
            and (name.endswith(("Handler", "Middleware")) or name == "DatabaseWrapper"))


def _is_library(dotted: str) -> bool:
    top = dotted.split(".", 1)[0]
    return bool(dotted) and "." in dotted and top not in STDLIB and top not in first_party()


@functools.cache
def _library_class(dotted: str) -> type | None:
    """The class a dotted name names (imported), or None when it cannot be imported here."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                target = getattr(target, name)
        except AttributeError:
            return None
        return target if isinstance(target, type) else None
    return None


@functools.cache
def library_privates(dotted: str) -> frozenset[str]:
    """The private attribute names (one leading underscore) a library class and its library bases define or set on
    ``self``: what a first-party subclass must neither read nor assign."""
    cls = _library_class(dotted)
    if cls is None:
        return frozenset()
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__.split(".", 1)[0] in STDLIB or klass.__module__.split(".", 1)[0] in first_party():
            continue
        names.update(n for n in vars(klass) if n.startswith("_") and not n.startswith("__"))
        with contextlib.suppress(OSError, TypeError):  # no source (a compiled class)
            names.update(re.findall(r"\bself\.(_[A-Za-z0-9]\w*)", inspect.getsource(klass)))
    return frozenset(n for n in names if not n.startswith("__"))


def _private_offences(tree: ast.AST, imports: dict[str, str]) -> list[tuple[int, str]]:
    """A private attribute of a library's object, read or assigned: one of :data:`LIBRARY_PRIVATES` on any object but
    a first-party class's own ``self``/``cls``, and in a subclass of a library class any of the privates that class
    (or a library base of it) has."""
    found: list[tuple[int, str]] = []
    owners: dict[int, tuple[str, list[str]]] = {}  # id(attribute node) -> (class name, its library bases)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [d for d in (_dotted(b, imports) for b in node.bases) if _is_library(d)]
            for inner in ast.walk(node):
                if isinstance(inner, ast.Attribute):
                    owners[id(inner)] = (node.name, bases)  # the innermost class wins: ast.walk visits outer first
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute)
                and (node.attr in LIBRARY_PRIVATES or (node.attr.startswith("_") and not node.attr.startswith("__")))):
            continue
        own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        name, bases = owners.get(id(node), ("", []))
        what = "assigns" if isinstance(node.ctx, ast.Store) else "reads"
        if own and bases:
            hit = next((b for b in bases if node.attr in (library_privates(b) if _library_class(b) is not None
                                                          else LIBRARY_PRIVATES)), None)
            if hit is not None:
                found.append((node.lineno, f"class {name}({hit}) {what} the library's private {node.attr}"))
        elif not own and node.attr in LIBRARY_PRIVATES:
            found.append((node.lineno, f"{what} a library object's private {node.attr}"))
    return found


def offences(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    imports = _imports(tree)
    found: list[tuple[int, str]] = _private_offences(tree, imports)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and part.attr in CONNECTION_STATE:
                        found.append((node.lineno, f"assigns Django's connection state ({part.attr} =)"))
                    elif isinstance(part, ast.Attribute) and part.attr == "__dict__":
                        found.append((node.lineno, "writes an instance's __dict__ (__dict__ =)"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if func.attr == "__new__" and node.args:
                found.append((node.lineno, "builds an instance with __new__( (past its constructor)"))
            elif func.attr == "update" and isinstance(func.value, ast.Attribute) and func.value.attr == "__dict__":
                found.append((node.lineno, "writes an instance's __dict__ (__dict__.update)"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in CONNECTION_STATE):
            found.append((node.lineno, f"assigns Django's connection state (setattr {node.args[1].value})"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(ORM_INTERNALS):
                    found.append((node.lineno, f"imports the ORM's internals ({alias.name})"))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            for module in modules:
                if module in ORM_INTERNALS or module.startswith(tuple(f"{m}." for m in ORM_INTERNALS)):
                    found.append((node.lineno, f"imports the ORM's internals ({module})"))
                    break
        elif isinstance(node, ast.ClassDef):
            bases = [d for d in (_dotted(b, imports) for b in node.bases) if _is_framework_machinery(d)]
            restated = sorted(
                item.name for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in WORK_METHODS)
            if bases and restated:
                found.append((node.lineno, f"class {node.name}({', '.join(bases)}) restates {', '.join(restated)}"))
    return found


def _scan() -> dict[str, list[str]]:
    report: dict[str, list[str]] = {}
    for path in app_files():
        relative = path.relative_to(ROOT).as_posix()
        for line, what in offences(path.read_text(encoding="utf-8")):
            report.setdefault(relative, []).append(f"{relative}:{line}: {what}")
    return report


def test_no_app_module_overrides_framework_internals() -> None:
    report = _scan()
    unexpected = [line for path, lines in report.items() if path not in ALLOWED for line in lines]
    assert not unexpected, "framework internals overridden (issue #51; use public APIs):\n" + "\n".join(unexpected)


def test_the_allow_list_names_only_files_that_still_offend() -> None:
    report = _scan()
    stale = [f"{path} ({why})" for path, why in ALLOWED.items() if path not in report]
    assert not stale, "no longer offending, remove from ALLOWED:\n" + "\n".join(stale)


def test_the_scan_reads_every_app_package() -> None:
    packages = {path.relative_to(ROOT).parts[0] for path in app_files()}
    assert {"config", "core", "agents", "flows", "tenants", "runtime", "releases"} <= packages, packages
    assert not packages & NOT_APP_CODE


def test_each_kind_of_offence_is_recognised() -> None:
    """The scan finds what it looks for (so a test that cannot fail does not pass for nothing)."""
    source = '''
import django.db.models.sql.compiler
from django.db.models import sql as orm_sql
from django.db.models.query_utils import DeferredAttribute
from django.core.handlers.asgi import ASGIHandler
import csp.middleware
from django.db.backends.postgresql import base
from django.core.management.base import BaseCommand
from django.db import connection

connection.in_atomic_block = True
connection.needs_rollback = False
setattr(connection, "autocommit", True)
obj = Model.__new__(Model)
obj.__dict__.update(row)
obj.__dict__["_state"] = state

class Handler(ASGIHandler):
    async def handle(self, scope, receive, send): ...

class CSP(csp.middleware.CSPMiddleware):
    def process_response(self, request, response): ...

class Wrapper(base.DatabaseWrapper):
    def create_cursor(self, name=None): ...

class Command(BaseCommand):  # a management command's handle is its public API
    def handle(self, *args, **options): ...

class Mine:
    autocommit_later = True

from channels_redis.core import RedisChannelLayer
from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from core.live import Publisher

class Layer(RedisChannelLayer):
    def send_groups(self, group, names, message):
        self._map_channel_keys_to_connection(names, message)
        return self._group_key(group)

class Client(RedisCacheClient):
    def get_client(self, key=None, *, write=False):
        return self._client(connection_pool=self._get_connection_pool(write))

class Cache(RedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = Client
        self._mine = {}

def close(response, layer):
    response._resource_closers.append(close)
    return layer._group_key("g")

class Own:
    def __init__(self, client):
        self._client = client
        self._known = {}

class Ours(Publisher):
    def send(self):
        return self._client
'''
    kinds = [what for _, what in offences(source)]
    assert len([k for k in kinds if "ORM's internals" in k]) == 3, kinds
    assert len([k for k in kinds if "connection state" in k]) == 3, kinds
    assert len([k for k in kinds if "__new__" in k]) == 1 and len([k for k in kinds if "__dict__" in k]) == 2, kinds
    assert [k for k in kinds if k.startswith("class ") and " restates " in k] == [
        "class Handler(django.core.handlers.asgi.ASGIHandler) restates handle",
        "class CSP(csp.middleware.CSPMiddleware) restates process_response",
        "class Wrapper(django.db.backends.postgresql.base.DatabaseWrapper) restates create_cursor",
    ], kinds
    privates = sorted(k for k in kinds if "private" in k)
    assert privates == sorted([
        "class Layer(channels_redis.core.RedisChannelLayer) reads the library's private _map_channel_keys_to_connection",
        "class Layer(channels_redis.core.RedisChannelLayer) reads the library's private _group_key",
        "class Client(django.core.cache.backends.redis.RedisCacheClient) reads the library's private _client",
        "class Client(django.core.cache.backends.redis.RedisCacheClient) reads the library's private _get_connection_pool",
        "class Cache(django.core.cache.backends.redis.RedisCache) assigns the library's private _class",
        "reads a library object's private _resource_closers",
        "reads a library object's private _group_key",
    ]), kinds  # not Cache's own _mine, nor a first-party class's own _client, _known (Own; Ours derives from ours)
    assert len(kinds) == 12 + 7, kinds


def test_the_private_attribute_check_knows_the_libraries_privates() -> None:
    """What a library class has privately is read from the installed library, not guessed: a channels_redis upgrade
    that renames ``_group_key`` still flags a subclass that uses the new name."""
    layer = library_privates("channels_redis.core.RedisChannelLayer")
    assert {"_group_key", "_map_channel_keys_to_connection"} <= layer, sorted(layer)
    assert {"_class"} <= library_privates("django.core.cache.backends.redis.RedisCache")
    assert {"_client", "_get_connection_pool", "_pools"} <= library_privates("django.core.cache.backends.redis.RedisCacheClient")
    assert library_privates("threading.Thread") == frozenset()  # the standard library is not checked this way
    assert library_privates("no_such_package.Thing") == frozenset()

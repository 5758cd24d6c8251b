"""Python tools that must be killable: each call in a child process, killed at the timeout.

A Python tool whose config says ``{"isolation": "process"}`` does not run on a thread of the
worker: :func:`run_in_process` starts a child process, which finds the function by its registry
key (importing the function's module if it has to), calls it with the JSON arguments and sends
the result back over a pipe. At the call's deadline the child is terminated (SIGTERM), then
killed (SIGKILL) if it is still there; the gateway's bulkhead slot is freed only once it is gone.

What such a function may do: take JSON arguments, return a picklable (JSON-able) result, raise.
It may not use the database (the child refuses to connect: it holds no transaction, lease or
audit row of the run, and a kill must never cut a query in half) and it does not see the
cancel signal (it does not need it).

Children are forked from a *fork server* (``multiprocessing``'s ``forkserver`` start method;
``spawn`` where there is none), a clean single-threaded process started on first use that has
set Django up once (:mod:`tools.isolation_child`), so a call costs a fork, not an interpreter
start. The fork server imports from the working directory: start the processes from the project
root, as the documented commands do (elsewhere each child sets Django up itself: slower, still
correct). :func:`warm_up` starts it ahead of the first call.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any

from tools.metrics import TOOL_KILLED

__all__ = ["ISOLATION_MODES", "DatabaseForbidden", "IsolatedToolError", "isolation_problems", "prepare_child", "run_in_process",
           "warm_up"]

log = logging.getLogger(__name__)

#: Seconds a terminated child has to exit before it is killed.
TERMINATE_GRACE = 0.5
#: Seconds to wait for a killed child to be reaped.
REAP_WAIT = 5.0

#: A Python tool's ``config["isolation"]``: a thread of the worker (the default) or a child process.
ISOLATION_MODES = ("thread", "process")

_context: Any = None
_context_lock = threading.Lock()


class IsolatedToolError(Exception):
    """The function raised in its process (the message names the exception) or the process died."""


class DatabaseForbidden(RuntimeError):
    """A process-isolated tool tried to use the database."""


def isolation_problems(kind: str, config: dict[str, Any]) -> list[str]:
    """What is wrong with a tool config's ``isolation`` (nothing when it is absent)."""
    if "isolation" not in config:
        return []
    if kind != "python":
        return ['only Python tools can run in a process of their own; remove "isolation"']
    if config["isolation"] not in ISOLATION_MODES:
        return ['must be "thread" (the default: a thread of the worker, sent a cancel signal at the timeout) or '
                '"process" (a child process, killed at the timeout; the function may not use the database)']
    return []


def mp_context() -> Any:
    """The multiprocessing context children are started with (the fork server, preloaded once)."""
    global _context
    with _context_lock:
        if _context is None:
            context: Any
            if "forkserver" in multiprocessing.get_all_start_methods():
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(["tools.isolation_child"])
            else:  # pragma: no cover - platforms without fork (Windows)
                context = multiprocessing.get_context("spawn")
            _context = context
        return _context


def warm_up(timeout: float = 60.0) -> None:
    """Start the fork server (and its one-time Django set-up) now rather than in the first call."""
    run_in_process("", {}, deadline=time.monotonic() + timeout, label="warm-up", module="")


def run_in_process(key: str, arguments: dict[str, Any], *, deadline: float, label: str, module: str | None = None,
                   tenant_id: int | None = None) -> Any:
    """Call the registered Python tool ``key`` in a child process (as a call of ``tenant_id``); kill it at ``deadline``
    (``time.monotonic()``).

    Raises :class:`~tools.executors.ToolFailure` (``timeout``: killed at the deadline; or the
    function's own ToolFailure) or :class:`IsolatedToolError` (it raised, or its process died).
    """
    from tools.executors import ToolFailure

    if module is None:
        from tools.pyfunc import registry

        module = registry.get(key).func.__module__
    context = mp_context()
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=child_main, args=(writer, module, key, arguments, tenant_id), name=f"tool:{label}", daemon=True)
    try:
        process.start()
    finally:
        writer.close()
    reply: Any = None
    timed_out = False
    try:
        ready = wait([reader, process.sentinel], timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            timed_out = True
        elif reader.poll():
            try:
                reply = reader.recv()
            except EOFError:
                reply = None
    finally:
        killed = _stop(process)
        reader.close()
    if timed_out:
        if killed:
            TOOL_KILLED.labels(tool=label[:100]).inc()
        raise ToolFailure("timeout", "No result was obtained in time: the tool's process was stopped. "
                                     "Do not tell the user it succeeded.")
    if not isinstance(reply, tuple) or not reply:
        raise IsolatedToolError(f"its process ended without a result (exit code {process.exitcode})")
    if reply[0] == "ok":
        return reply[1]
    if reply[0] == "failure":
        raise ToolFailure(reply[1], reply[2])
    raise IsolatedToolError(reply[1])


def _stop(process: Any) -> bool:
    """Make sure the child is gone (terminate, then kill); True if it had to be stopped."""
    stopped = False
    if process.is_alive():
        stopped = True
        process.terminate()
        process.join(TERMINATE_GRACE)
        if process.is_alive():
            process.kill()
    process.join(REAP_WAIT)
    if process.is_alive():  # pragma: no cover - a process stuck in the kernel
        log.error("the process of an isolated tool call (pid %s) did not exit after SIGKILL", process.pid)
    return stopped


# -- the child's side ---------------------------------------------------------------------------

_prepared = False
_setup_error = ""


def _refuse_database(*args: Any, **kwargs: Any) -> Any:
    raise DatabaseForbidden("a process-isolated tool may not use the database")


def prepare_child() -> None:
    """Once per process: switch the database off, then set Django up (so tool modules can import models)."""
    global _prepared, _setup_error
    if _prepared:
        return
    _prepared = True
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return
    try:
        from django.db.backends.base.base import BaseDatabaseWrapper

        BaseDatabaseWrapper.connect = _refuse_database
        import django

        django.setup()
    except Exception as exc:  # reported by the call that needs it, not by the fork server
        _setup_error = f"{type(exc).__name__}: {exc}"


def _import_tool_module(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as exc:
        setup = f"; Django could not be set up there: {_setup_error}" if _setup_error else ""
        raise IsolatedToolError(f"the tool's module {module} could not be imported in its process "
                                f"({type(exc).__name__}: {exc}{setup})") from None


def child_main(conn: Connection, module: str, key: str, arguments: dict[str, Any], tenant_id: int | None = None) -> None:
    """Runs in the child: resolve ``key``, call it, send ``("ok", result)`` or what went wrong."""
    reply: tuple[Any, ...]
    try:
        prepare_child()
        if not key:  # warm_up
            reply = ("ok", None)
        else:
            from tools.pyfunc import registry, tenant_scope

            if key not in registry and module:
                _import_tool_module(module)
            with tenant_scope(tenant_id):
                reply = ("ok", registry.call(key, arguments))
    except BaseException as exc:  # a ToolFailure keeps its audit status; anything else is an error
        status = getattr(exc, "status", None) if type(exc).__name__ == "ToolFailure" else None
        reply = ("failure", status, str(exc)) if isinstance(status, str) else ("error", f"{type(exc).__name__}: {exc}")
    try:
        conn.send(reply)
    except Exception as exc:  # e.g. a result that cannot be pickled
        conn.send(("error", f"its result could not be sent back ({type(exc).__name__}: {exc})"))
    finally:
        conn.close()

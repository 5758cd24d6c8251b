"""Kind ``python``: a function registered in the process (``config = {"function": "<key>", "isolation": ...}``)."""

from __future__ import annotations

import time
from typing import Any

from tools.executors import ExecContext
from tools.isolation import run_in_process
from tools.kinds.base import AddProblem, Kind
from tools.models import Tool
from tools.pyfunc import registry


def execute(tool: Tool, arguments: dict[str, Any], ctx: ExecContext) -> Any:
    key = str(tool.config.get("function", ""))
    if tool.config.get("isolation") == "process":  # in a child process, killed at the deadline (tools.isolation)
        deadline = ctx.deadline if ctx.deadline is not None else time.monotonic() + float(tool.timeout_seconds)
        return run_in_process(key, arguments, deadline=deadline, label=tool.name)
    return registry.call(key, arguments)


def check(config: dict[str, Any], parameters: dict[str, Any], tenant: Any, add: AddProblem) -> None:
    function = config.get("function")
    if not isinstance(function, str) or function not in registry:
        known = ", ".join(sorted(registry.keys())[:20]) or "none"
        add("function", f"must name a registered Python tool; got {function!r}. Registered: {known}.")


KIND = Kind(name="python", execute=execute, check=check)

"""Kind ``python``: a function registered in the process (``config = {"function": "<key>", "isolation": ...}``)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator

from runtime.documents import Leaf, problem, text
from tools.executors import ExecContext
from tools.isolation import ISOLATION_MODES, isolation_problems, run_in_process
from tools.kinds.base import Kind, ToolConfig, read_config, saving
from tools.models import Tool
from tools.pyfunc import registry, tenant_scope


def _isolation(value: Any) -> str:
    found = isolation_problems("python", {"isolation": value})
    if found:
        raise problem(found[0])
    return str(value)


class PythonConfig(ToolConfig):
    """A function registered with ``@tool``, run in a worker thread or a child process."""

    function: Annotated[str, text(nullable=False), Field(description="the key of a registered Python tool, e.g. order_desk.query_order")]
    isolation: Annotated[str, Leaf(_isolation, {"type": "string", "enum": list(ISOLATION_MODES)})] = "thread"

    @field_validator("function")
    @classmethod
    def _registered(cls, function: str, info: ValidationInfo) -> str:
        if saving(info) is not None and function not in registry:  # when run, the registry itself says so
            known = ", ".join(sorted(registry.keys())[:20]) or "none"
            raise problem(f"must name a registered Python tool; got {function!r}. Registered: {known}.")
        return function


def execute(tool: Tool, arguments: dict[str, Any], ctx: ExecContext) -> Any:
    config = read_config(PythonConfig, tool)
    if config.isolation == "process":  # in a child process, killed at the deadline (tools.isolation)
        deadline = ctx.deadline if ctx.deadline is not None else time.monotonic() + float(tool.timeout_seconds)
        return run_in_process(config.function, arguments, deadline=deadline, label=tool.name, tenant_id=ctx.tenant_id)
    with tenant_scope(ctx.tenant_id):  # the function keeps what it keeps per tenant (tools.pyfunc.current_tenant)
        return registry.call(config.function, arguments)


KIND = Kind(name="python", execute=execute, config_model=PythonConfig)

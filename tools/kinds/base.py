"""What a tool kind is: its executor, its config document, its defaults and (optionally) a request preview.

A kind's config is a typed document (:class:`ToolConfig`, ``runtime.documents``): its fields carry their
defaults and wording, its JSON Schema is what the API shows, and code reads it typed
(:func:`read_config`). Checks that need the tool's ``parameters`` or its ``tenant`` are field validators
reading them from the validation context (:func:`saving`); they run when a tool is saved, not when it runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import Field, ValidationInfo

from runtime.documents import Document, DocumentError, number, parse, problems
from tools.executors import Executor, ToolFailure

#: ``add(config_key, message)``: record a problem with the tool's config.
AddProblem = Callable[[str, str], None]
#: ``request_preview(tool, arguments, sensitive_fields)``: what the call would send (secrets unresolved); raises if it cannot.
RequestPreview = Callable[[Any, dict[str, Any], Sequence[str]], Any]
C = TypeVar("C", bound="ToolConfig")


class ToolConfig(Document):
    """What every kind's config may hold besides its own fields."""

    duplicate_window_seconds: Annotated[
        float | None, number(minimum=0), Field(description="a write tool's window for refusing the same call twice (default: settings)")
    ] = None


def saving(info: ValidationInfo) -> dict[str, Any] | None:
    """The save-time context (``parameters``, ``tenant``), or None when a stored config is only being read."""
    context = info.context or {}
    return context if "parameters" in context else None


def read_config(model: type[C], tool: Any) -> C:
    """The tool's config as its kind's typed document; a stored config that no longer fits is a failure the model reads."""
    try:
        return parse(model, tool.config or {}, what=f"config of tool {tool.name!r}")
    except DocumentError as exc:
        raise ToolFailure("error", f"The tool {tool.name} is misconfigured ({'; '.join(exc.errors)}); "
                                   "tell the user it is unavailable.") from None


def by_key(found: Sequence[str]) -> dict[str, list[str]]:
    """``["url: msg", "headers.X: msg"]`` -> ``{"url": ["msg"], "headers": ["X: msg"]}`` (the API's ``config.<key>``)."""
    grouped: dict[str, list[str]] = {}
    for item in found:
        path, _, message = item.partition(": ")
        key = re.split(r"[.\[]", path, maxsplit=1)[0] or "config"
        rest = path[len(key):].lstrip(".")
        grouped.setdefault(key, []).append(f"{rest}: {message}" if rest else message)
    return grouped


@dataclass(frozen=True)
class Kind:
    name: str
    execute: Executor
    #: The config's typed document; its validators get ``parameters`` and ``tenant`` as context when a tool is saved.
    config_model: type[ToolConfig]
    #: A new tool's timeout when none is given.
    default_timeout: float = 10.0
    #: A new tool's parameters when none are given (None: the operator must define them).
    default_parameters: dict[str, Any] | None = None
    #: Shown to approvers and by the tools API's test call; None: the arguments say it all.
    request_preview: RequestPreview | None = None

    def problems(self, config: Any, parameters: dict[str, Any], tenant: Any) -> dict[str, list[str]]:
        """Every problem of ``config``, keyed by the config key it concerns."""
        context = {"parameters": parameters or {}, "tenant": tenant}
        return by_key(problems(self.config_model, config, context=context)[1])

    def check(self, config: Any, parameters: dict[str, Any], tenant: Any, add: AddProblem) -> None:
        for key, messages in self.problems(config, parameters, tenant).items():
            for message in messages:
                add(key, message)

    def config_schema(self) -> dict[str, Any]:
        return self.config_model.model_json_schema()


def string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


_SECRET_REF = re.compile(r"secret:([A-Za-z0-9_.\-/]+)")


def secret_problems(values: Any, tenant: Any) -> list[str]:
    """Secrets are process-wide (``TOOL_SECRET_<NAME>``): a tenant may only name those listed for it.

    The list is ``tenant.settings["tool_secrets"]``, kept by a platform administrator; without it a
    tenant's operator could send another tenant's secret to a server of their choosing.
    """
    if not isinstance(values, dict):
        return []
    allowed = set((getattr(tenant, "settings", None) or {}).get("tool_secrets", []))
    named = sorted({m.group(1) for v in values.values() if isinstance(v, str) for m in _SECRET_REF.finditer(v)})
    return [f"the secret {name} is not available to this tenant; a platform administrator lists the secrets a tenant "
            "may use in its settings (tool_secrets)" for name in named if name not in allowed]

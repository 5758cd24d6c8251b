"""What a tool kind is: its executor, its config checks, its defaults and (optionally) a request preview."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tools.executors import Executor

#: ``add(config_key, message)``: record a problem with the tool's config.
AddProblem = Callable[[str, str], None]
#: ``check(config, parameters, tenant, add)``: the kind's own checks of a tool's config (``tenant`` may be None).
ConfigCheck = Callable[[dict[str, Any], dict[str, Any], Any, AddProblem], None]
#: ``request_preview(tool, arguments, sensitive_fields)``: what the call would send (secrets unresolved); raises if it cannot.
RequestPreview = Callable[[Any, dict[str, Any], Sequence[str]], Any]


@dataclass(frozen=True)
class Kind:
    name: str
    execute: Executor
    check: ConfigCheck
    #: A new tool's timeout when none is given.
    default_timeout: float = 10.0
    #: A new tool's parameters when none are given (None: the operator must define them).
    default_parameters: dict[str, Any] | None = None
    #: Shown to approvers and by the tools API's test call; None: the arguments say it all.
    request_preview: RequestPreview | None = None


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

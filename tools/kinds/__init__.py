"""Tool kinds: one module per kind (``tools/kinds/<kind>.py``: executor, config document, defaults, preview), one table.

Adding a kind: write its module, add it to :data:`KINDS` and to ``tools.models.ToolKind`` (the
column's choices, with its migration). Nothing else names a kind.
"""

from __future__ import annotations

import json
from typing import Any

from tools.executors import Executor, ToolFailure
from tools.kinds import agent, http, mcp, python
from tools.kinds.base import Kind

KINDS: dict[str, Kind] = {kind.name: kind for kind in (python.KIND, http.KIND, mcp.KIND, agent.KIND)}


def kind_for(name: str) -> Kind | None:
    return KINDS.get(name)


def executor_for(name: str) -> Executor:
    kind = KINDS.get(name)
    if kind is None:
        raise ToolFailure("error", f"Tools of kind {name!r} cannot be executed here.")
    return kind.execute


def config_schemas() -> dict[str, dict[str, Any]]:
    """Each kind's config JSON Schema (its typed document's), by kind: what the API and the admin editor show."""
    return {name: kind.config_schema() for name, kind in KINDS.items()}


def config_help() -> str:
    """One line per kind: its config's fields, required ones marked, defaults shown (the admin's help text)."""
    lines = []
    for name, kind in KINDS.items():
        fields = [f"{key} (required)" if field.is_required() else f"{key} = {json.dumps(field.default)}"
                  for key, field in kind.config_model.model_fields.items() if key != "duplicate_window_seconds"]
        lines.append(f"{name}: {', '.join(fields)}")
    return "Kind-specific settings, checked when saved. " + "; ".join(lines) + "."

"""Tool kinds: one module per kind (``tools/kinds/<kind>.py``: executor, config document, defaults, preview), one table.

Adding a kind: write its module, add it to :data:`KINDS` and to ``tools.models.ToolKind`` (the
column's choices, with its migration). Nothing else names a kind.
"""

from __future__ import annotations

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

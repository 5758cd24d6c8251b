"""``manage.py list_extensions``: the hook and interceptor kinds versions may name, and the ones they may not (why)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from agents.extensions import SETTING, describe
from runtime.plugins import BUILTIN


def _fields(schema: dict[str, Any] | None, *, builtin: bool) -> str:
    """``secret: string (required), mask: string`` from a JSON Schema object."""
    if not schema:
        return "-"
    required = set(schema.get("required") or [])
    parts = []
    for name, spec in (schema.get("properties") or {}).items():
        if builtin and name in {"name", "kind"}:
            continue  # every hook entry has them
        kind = (spec.get("type") or ("enum" if "enum" in spec else "any")) if isinstance(spec, dict) else "any"
        parts.append(f"{name}: {kind}{' (required)' if name in required else ''}")
    return ", ".join(parts) or "no settings"


class Command(BaseCommand):
    help = (
        "List the hook and interceptor extensions: the built-in hook kinds and the classes installed packages "
        "contribute (entry-point groups agentops.hooks, agentops.model_interceptors, agentops.tool_interceptors), "
        f"with their source distribution, config schema and availability ({SETTING} restricts them)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="Print the table as JSON, with each full config schema.")
        parser.add_argument("--strict", action="store_true", help="Exit with an error if any extension is unavailable.")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = describe()
        if options["json"]:
            self.stdout.write(json.dumps(rows, indent=2, sort_keys=True))
        else:
            for row in rows:
                status = "available" if row["available"] else "UNAVAILABLE"
                self.stdout.write(f"{row['kind']}  [{row['group']}]  from {row['source']}  {status}")
                if row["target"]:
                    self.stdout.write(f"    entry point: {row['target']}")
                builtin = row["source"] == BUILTIN
                label = "fields" if builtin else "config"  # a built-in hook's fields sit in its entry; others' under "config"
                self.stdout.write(f"    {label}: {_fields(row['schema'], builtin=builtin)}")
                if not row["available"]:
                    self.stdout.write(f"    reason: {row['reason']}")
        broken = [row["kind"] for row in rows if not row["available"]]
        if options["strict"] and broken:
            raise CommandError(f"{len(broken)} extension(s) unavailable: {', '.join(broken)}")

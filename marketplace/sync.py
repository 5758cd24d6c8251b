"""Mirror the code's plugin catalog into the database (``Plugin`` rows, read-only elsewhere)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from audit.services import record_change
from marketplace.catalog import PluginCatalog, PluginSpec, catalog
from marketplace.models import Plugin

log = logging.getLogger(__name__)


@dataclass
class SyncReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.retired)


def store_spec(spec: PluginSpec, tool_registry: Any, *, using: str = DEFAULT_DB_ALIAS) -> Plugin:
    row, _ = Plugin.objects.using(using).update_or_create(
        key=spec.key, version=spec.version, defaults={**spec.as_row(tool_registry), "available": True})
    return row


def sync_catalog(*, plugins: PluginCatalog | None = None, using: str = DEFAULT_DB_ALIAS, retire_missing: bool = True) -> SyncReport:
    """Write a row per plugin key + version of the catalog; mark rows the code no longer provides unavailable.

    Rows are never deleted: installs point at the version they consented to.
    """
    source = plugins or catalog
    report = SyncReport()
    with transaction.atomic(using=using):
        current: set[tuple[str, str]] = set()
        for spec in source:
            current.add((spec.key, spec.version))
            label = f"{spec.key} {spec.version}"
            wanted = {**spec.as_row(source.tool_registry), "available": True}
            row = Plugin.objects.using(using).filter(key=spec.key, version=spec.version).first()
            if row is None:
                Plugin.objects.using(using).create(key=spec.key, version=spec.version, **wanted)
                report.created.append(label)
            elif any(getattr(row, name) != value for name, value in wanted.items()):
                if row.available and row.tools != wanted["tools"]:
                    log.warning("plugin %s changed without a new version number; installs keep their tool rows until refreshed", label)
                for name, value in wanted.items():
                    setattr(row, name, value)
                row.save(using=using)
                report.updated.append(label)
            else:
                report.unchanged.append(label)
        if retire_missing:
            for row in Plugin.objects.using(using).filter(available=True):
                if (row.key, row.version) not in current:
                    row.available = False
                    row.save(using=using, update_fields=["available", "synced_at"])
                    report.retired.append(f"{row.key} {row.version}")
        if report.changed and using == DEFAULT_DB_ALIAS:
            record_change(tenant=None, actor=None, action="plugin.catalog_synced",
                          details={"created": report.created, "updated": report.updated, "retired": report.retired})
    return report


def sync_after_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, verbosity: int = 1, **kwargs: Any) -> None:
    """post_migrate receiver: keep the stored catalog in step with the code after every ``migrate``."""
    tables = connections[using].introspection.table_names()
    if Plugin._meta.db_table not in tables:
        return  # migrated backwards past the marketplace: nothing to sync into
    report = sync_catalog(using=using)
    if verbosity >= 1 and report.changed:
        print(f"  Plugin catalog synced: {len(report.created)} new, {len(report.updated)} updated, {len(report.retired)} retired.")

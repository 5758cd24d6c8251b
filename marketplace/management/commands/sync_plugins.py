"""``manage.py sync_plugins``: write the code's plugin catalog to the database (also runs after migrate)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from marketplace.catalog import catalog
from marketplace.sync import sync_catalog


class Command(BaseCommand):
    help = "Sync the plugin catalog (built-in plugins and the agentops.plugins entry points) to the database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--keep-missing", action="store_true", help="Do not mark plugins the code no longer provides as unavailable.")

    def handle(self, *args: Any, **options: Any) -> None:
        for name, message in catalog.load_errors:
            self.stderr.write(self.style.ERROR(f"entry point {name} could not be loaded: {message}"))
        report = sync_catalog(retire_missing=not options["keep_missing"])
        for label in report.created:
            self.stdout.write(f"  new      {label}")
        for label in report.updated:
            self.stdout.write(f"  updated  {label}")
        for label in report.retired:
            self.stdout.write(f"  retired  {label}")
        self.stdout.write(self.style.SUCCESS(
            f"{len(catalog)} plugin(s) in the catalog: {len(report.created)} new, {len(report.updated)} updated, "
            f"{len(report.unchanged)} unchanged, {len(report.retired)} retired."))

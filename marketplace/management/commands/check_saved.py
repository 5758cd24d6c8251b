"""``manage.py check_saved [--tenant <slug>] [--live-only] [--json]``: today's save-time checks over the stored agent
and flow versions and tools (marketplace/saved_checks.py). Prints each one that would be refused now, and why; exits 1
when there is one (for a deploy step), 0 when there is none. It changes nothing."""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from marketplace.saved_checks import saved_problems
from tenants.models import Tenant


class Command(BaseCommand):
    help = ("Re-run today's save-time checks over stored versions and tools (the checks grew stricter since some were "
            "saved); list what fails and why, and exit 1 if anything does.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", default="", help="Only this tenant's versions and tools (its slug).")
        parser.add_argument("--live-only", action="store_true",
                            help="Only versions new runs may get (an agent's current version, or one with a release weight).")
        parser.add_argument("--json", action="store_true", help="One JSON document: {\"problems\": [...]}.")

    def handle(self, *args: Any, tenant: str, live_only: bool, json: bool, **options: Any) -> None:
        if tenant and not Tenant.objects.filter(slug=tenant).exists():
            raise CommandError(f"No tenant {tenant!r}; give a tenant's slug, or no --tenant for all of them.")
        found = list(saved_problems(tenant_slug=tenant, live_only=live_only))
        if json:
            self.stdout.write(_json_document(found))
        elif found:
            for problem in found:
                self.stdout.write(problem.line())
            self.stdout.write(f"{len(found)} stored item(s) would be refused at save today; a run of such a version is "
                              "refused when it starts. Fix each one (a version runs used: make a new version).")
        else:
            self.stdout.write("Every stored version and tool passes today's checks.")
        if found:
            sys.exit(1)


def _json_document(found: list[Any]) -> str:
    return json.dumps({"problems": [p.as_dict() for p in found]}, indent=2, ensure_ascii=False)

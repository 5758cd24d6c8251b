"""``manage.py verify_audit``: check the audit chains (tool calls and configuration changes); exit non-zero on a break.

``--export-heads FILE`` writes a small signed record of every chain's head, to keep where the database's writers
cannot reach; ``--against FILE`` checks the database against such a record, which catches rows deleted at the end
of a chain (with the head lowered to match) and a rewritten chain.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.chain import check_against, unchained_changes, verify_changes, verify_tenant
from audit.chain import export_heads as signed_heads
from audit.models import ConfigChainHead
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Verify the keyed hash chains of tool-call audit rows and configuration changes; export or check the heads."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", help="Only this tenant (slug).")
        parser.add_argument("--export-heads", metavar="FILE", help="Write a signed record of the chains' heads to FILE.")
        parser.add_argument("--against", metavar="FILE", help="Also check that every head in this exported record is still there.")

    def handle(self, *args: Any, tenant: str | None = None, export_heads: str | None = None, against: str | None = None,
               **options: Any) -> None:
        tenants = Tenant.objects.order_by("slug")
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"No tenant {tenant!r}.")
        broken = False
        for t in tenants:
            for label, (checked, brk) in (("tool calls", verify_tenant(t.pk)), ("config changes", verify_changes(f"tenant:{t.pk}"))):
                broken |= self._report(f"{t.slug} {label}", checked, brk)
        if not tenant and ConfigChainHead.objects.filter(chain="platform").exists():
            broken |= self._report("platform config changes", *verify_changes("platform"))
        loose = unchained_changes(tenants.values_list("pk", flat=True) if tenant else None)
        if loose:
            broken = True
            self.stdout.write(self.style.ERROR(f"{loose} configuration change(s) are in no chain (written around the service)"))
        if against:
            try:
                record = json.loads(Path(against).read_text())
            except (OSError, ValueError) as exc:
                raise CommandError(f"Cannot read the exported record {against}: {exc}") from None
            problems = check_against(record)
            for problem in problems:
                self.stdout.write(self.style.ERROR(f"against {against}: {problem}"))
            if not problems:
                self.stdout.write(f"against {against}: every exported head is still in place")
            broken |= bool(problems)
        if broken:
            raise CommandError("The audit chain is broken; see above.")
        if export_heads:
            record = signed_heads()
            Path(export_heads).write_text(json.dumps(record, indent=1, sort_keys=True))
            self.stdout.write(f"exported {len(record['chains'])} chain heads to {export_heads}")

    def _report(self, name: str, checked: int, brk: Any) -> bool:
        if brk is None:
            self.stdout.write(f"{name}: OK, {checked} rows")
            return False
        row = f"audit row {brk.row_id}" if brk.row_id is not None else "the end of the chain"
        self.stdout.write(self.style.ERROR(f"{name}: BROKEN at {row} (chain_seq {brk.chain_seq}): {brk.reason}; "
                                           f"{checked} rows before it are intact"))
        return True

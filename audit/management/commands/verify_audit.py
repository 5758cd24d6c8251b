"""``manage.py verify_audit [--tenant SLUG]``: check the tool-call audit hash chains; exit 1 at the first break."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.chain import verify_tenant
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Verify the hash chain of tool-call audit rows for each tenant and report the first broken row."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", help="Only this tenant (slug).")

    def handle(self, *args: Any, tenant: str | None = None, **options: Any) -> None:
        tenants = Tenant.objects.order_by("slug")
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"No tenant {tenant!r}.")
        broken = False
        for t in tenants:
            checked, brk = verify_tenant(t.pk)
            if brk is None:
                self.stdout.write(f"{t.slug}: OK, {checked} sealed audit rows")
            else:
                broken = True
                self.stdout.write(
                    self.style.ERROR(
                        f"{t.slug}: BROKEN at audit row {brk.row_id} (chain_seq {brk.chain_seq}): {brk.reason}; "
                        f"{checked} rows before it are intact"
                    )
                )
        if broken:
            raise CommandError("The audit chain is broken; see above.")

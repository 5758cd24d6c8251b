"""``manage.py resolve_attention``: list the runs that need an operator's attention, or resolve one.

``manage.py resolve_attention [--tenant <slug>]`` lists them (id, tenant, agent, what to check);
``manage.py resolve_attention <run id> --by <username> --note "what you checked"`` resolves one through the same
service as the API, the admin action and the console (``agents.attention.resolve_attention``): the run stops needing
attention, its reasons stay, and the configuration-change audit records who (``--by``, an operator or owner of the
run's tenant, or a superuser) and the note.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from agents import attention
from agents.models import Run
from tenants.scoping import actor_for_user


class Command(BaseCommand):
    help = "List the runs that need attention (no run given), or resolve one: RUN --by USERNAME --note TEXT."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run", nargs="?", default="", help="The run's id (a UUID) to resolve; omit to list.")
        parser.add_argument("--tenant", default="", help="List only this tenant's runs (its slug).")
        parser.add_argument("--by", default="", help="Who checked: the username recorded in the audit (required to resolve).")
        parser.add_argument("--note", default="", help="What was checked and found (required to resolve).")

    def handle(self, *args: Any, run: str, tenant: str, by: str, note: str, **options: Any) -> None:
        if not run:
            self._list(tenant)
            return
        try:
            run_id = uuid.UUID(run)
        except ValueError:
            raise CommandError(f"Not a run id (a UUID): {run!r}.") from None
        target = Run.objects.filter(pk=run_id).first()
        if target is None:
            raise CommandError(f"No run {run_id}.")
        if not by:
            raise CommandError("--by names who checked (a username); the audit records it.")
        user = get_user_model().objects.filter(username=by, is_active=True).first()
        if user is None:
            raise CommandError(f"No active user {by!r}.")
        try:
            attention.resolve_attention(actor=actor_for_user(user), run=target, note=note, via="command")
        except PermissionDenied:
            raise CommandError(f"{by!r} is not an operator or owner of the run's tenant (nor a superuser).") from None
        except attention.AttentionRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Resolved run {run_id}; recorded as {attention.RESOLVED_ACTION} by {by}.")

    def _list(self, tenant: str) -> None:
        runs = Run.objects.filter(needs_attention=True).select_related("tenant", "agent").order_by("created_at")
        if tenant:
            runs = runs.filter(tenant__slug=tenant)
        count = 0
        for run in runs.iterator(chunk_size=500):
            count += 1
            what = "; ".join(attention.message_for(r) for r in attention.open_reasons(run)) or "see its reasons"
            self.stdout.write(f"{run.pk}  {run.tenant.slug}/{run.agent.slug}  {run.terminal_reason or run.status}  {what}")
        self.stdout.write(f"{count} run(s) need attention.")

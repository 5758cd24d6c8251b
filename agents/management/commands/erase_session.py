"""``manage.py erase_session <uuid> --tenant <slug> --reason "..." [--by <username>]``: a data-subject request by hand.

The same service as ``DELETE /api/v1/sessions/<id>`` (``agents.erasure.erase_session``): the same erasure, the same
refusal while a run is active, the same single audit tombstone.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from agents.erasure import ErasureRefused, erase_session
from agents.models import Session
from tenants.models import Tenant
from tenants.scoping import Actor, actor_for_user


class Command(BaseCommand):
    help = (
        "Erase a session's stored inputs, messages and outputs (and those of sessions its agent tools started); "
        "the configuration-change audit keeps a tombstone (who, when, why, counts). Refused while a run of it is active."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("session", help="The session's id (a UUID).")
        parser.add_argument("--tenant", required=True, help="The slug of the session's tenant (a check: it must match).")
        parser.add_argument("--reason", required=True, help="Why, e.g. the ticket of the request; no personal data.")
        parser.add_argument("--by", default="", help="The username recorded as the eraser; an owner of the tenant or a "
                                                     "superuser. Without it the tombstone names no person (via: command).")

    def handle(self, *args: Any, session: str, tenant: str, reason: str, by: str, **options: Any) -> None:
        if not reason.strip():
            raise CommandError("--reason must say why (e.g. the ticket of the data-subject request).")
        try:
            session_id = uuid.UUID(session)
        except ValueError:
            raise CommandError(f"Not a session id (a UUID): {session!r}.") from None
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise CommandError(f"No tenant {tenant!r}.")
        target = Session.objects.for_tenant(found).filter(pk=session_id).first()
        if target is None:
            raise CommandError(f"No session {session_id} in tenant {tenant!r}.")
        actor = Actor(is_superuser=True)  # whoever runs manage.py already holds the database
        if by:
            user = get_user_model().objects.filter(username=by, is_active=True).first()
            if user is None:
                raise CommandError(f"No active user {by!r}.")
            actor = actor_for_user(user)
        try:
            result = erase_session(actor=actor, session=target, reason=reason, via="command")
        except PermissionDenied:
            raise CommandError(f"{by!r} is not an owner of tenant {tenant!r} (nor a superuser); erasing needs one.") from None
        except ErasureRefused as exc:
            raise CommandError(str(exc)) from None
        if result.already:
            self.stdout.write(f"Session {session_id} was already erased; nothing changed.")
            return
        counts = ", ".join(f"{name} {count}" for name, count in result.counts.items())
        self.stdout.write(f"Erased session {session_id}: {counts}. The audit keeps a tombstone (session.erased).")

"""Revealing a masked field of an approval request to an approver who holds the permission for it.

The approver's preview masks the fields the tool declares sensitive (``Tool.sensitive_fields``), e.g. the demo
refund's ``reason``. An approver who may decide the request *and* holds the Django permission
``approvals.reveal_sensitive_fields`` (granted to a user or a group in the admin; a superuser holds every permission)
may see one such field unmasked. Every reveal writes an audit row (who, which field, which request, when); the value
itself is returned to the caller only: never logged, audited, traced or published.

A foreign tenant's request is not found (404); a request the actor sees but may not reveal is forbidden (403).
Names that are secrets whatever the tool says (passwords, tokens, keys: :data:`audit.masking.ALWAYS_SENSITIVE` and
the like) are never revealed, and only top-level arguments are.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from approvals.decisions import may_decide
from approvals.models import ApprovalRequest
from audit.masking import is_sensitive_key, normalize_key
from audit.services import record_change
from core.errors import Forbidden, Invalid, NotFound
from tenants.scoping import Actor

PERMISSION = "approvals.reveal_sensitive_fields"


def grant_reveal(*, tenant: Any, user: Any, actor: Actor | None) -> None:
    """Give ``user`` the reveal permission (the demo seed's approver; otherwise the admin's user or group pages).
    The permission is platform-wide, but only counts where the user may decide, so it never crosses tenants."""
    from django.contrib.auth.models import Permission

    app_label, codename = PERMISSION.split(".")
    if user.has_perm(PERMISSION):
        return
    user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    record_change(tenant=tenant, actor=actor, action="approval.reveal_granted", target=user,
                  details={"user": user.get_username(), "permission": PERMISSION})


def revealable_fields(request: ApprovalRequest) -> list[str]:
    """The top-level arguments masked only because the tool declares them sensitive (never secrets by name)."""
    tool = request.tool
    declared = {normalize_key(f) for f in (tool.sensitive_fields or [])} if tool is not None else set()
    arguments = request.arguments if isinstance(request.arguments, dict) else {}
    return [key for key in arguments if normalize_key(key) in declared and not is_sensitive_key(key)]


def may_reveal(actor: Actor, request: ApprovalRequest) -> bool:
    """A person (not an API key) who may decide this request and holds the reveal permission."""
    user = actor.user
    if user is None or actor.api_key is not None or not user.is_active:
        return False
    return may_decide(actor, request) and (actor.is_superuser or user.has_perm(PERMISSION))


def reveal(*, actor: Actor, request_id: Any, field: str) -> str:
    """The unmasked value of ``field`` (JSON for a non-string) after writing the audit row."""
    with transaction.atomic():
        request = (
            ApprovalRequest.objects.for_actor(actor, "review").select_related("tool", "tenant").filter(pk=request_id).first()
        )
        if request is None:
            raise NotFound("No such approval request.")
        if not may_reveal(actor, request):
            raise Forbidden(
                "Revealing masked fields needs the permission 'Can reveal sensitive fields of approval requests' "
                "and a role that may decide this request."
            )
        fields = revealable_fields(request)
        if field not in fields:
            offered = ", ".join(fields) or "none"
            raise Invalid(f"field must name a masked argument of this request; revealable here: {offered}.", field="field")
        record_change(
            tenant=request.tenant,
            actor=actor,
            action="approval.field_revealed",
            target=request,
            details={"field": field, "tool": request.tool_name, "run": str(request.run_id), "status": request.status},
        )
    value = request.arguments[field]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

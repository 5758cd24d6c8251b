"""Decisions on approval requests: who may decide, deciding, expiry, cancelling with a run, live publishing.

A decided request resumes its run through the handler the agents app registers (``tools.handlers``).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals import edits, metrics
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from audit.services import record_change
from core import live
from core.errors import DomainError
from runtime.approval_policy import DEFAULT_APPROVER_ROLES
from tenants.scoping import Actor
from tools import handlers

FINAL = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED, ApprovalStatus.CANCELLED)


class ApprovalRefused(DomainError):
    """A decision that cannot be taken. ``status`` is the HTTP status that fits (403, 404, 409)."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message, status=status, code={403: "forbidden", 404: "not_found"}.get(status, "conflict"))


def may_decide(actor: Actor, request: ApprovalRequest) -> bool:
    if actor.is_superuser:
        return True
    role = actor.roles.get(request.tenant_id)
    if role is not None and role in (request.approver_roles or DEFAULT_APPROVER_ROLES):
        return True
    user = actor.user
    return bool(
        user is not None
        and request.tool is not None
        and actor.api_key is None
        and role is not None
        and user.has_perm("tools.approve_tool", request.tool)
    )


def decide(*, actor: Actor, request_id: Any, approve: bool, note: str = "", via: str = "page",
           arguments: dict[str, Any] | None = None, seen_hash: str = "") -> ApprovalRequest:
    """Approve or reject. Refuses self-approval, foreign tenants (404), and requests no longer pending.

    ``arguments``: the fields an approver changes before approving (see ``approvals.edits``); the request then runs
    with the edited arguments, bound by their hash. ``seen_hash``: the hash of the arguments the approver saw; a
    decision on arguments that changed meanwhile (another approver edited them) is refused."""
    with transaction.atomic():
        # An overdue request expires now (and stays expired: this commits before the refusal below).
        overdue = ApprovalRequest.objects.for_actor(actor, "review").select_for_update(of=("self",)).filter(
            pk=request_id, status=ApprovalStatus.PENDING, expires_at__lte=timezone.now()).first()
        if overdue is not None:
            expire(overdue)
    with transaction.atomic():
        request = (
            ApprovalRequest.objects.for_actor(actor, "review")
            .select_for_update(of=("self",))
            .select_related("run", "run__api_key", "tool")
            .filter(pk=request_id)
            .first()
        )
        if request is None:
            raise ApprovalRefused("No such approval request.", 404)
        if not may_decide(actor, request):
            raise ApprovalRefused("Your role does not allow you to decide this request.", 403)
        if request.status != ApprovalStatus.PENDING:
            raise ApprovalRefused(f"This request is already {request.status}; your decision was not recorded.", 409)
        user = actor.user
        run = request.run
        starter_ids = {run.created_by_id, run.api_key.created_by_id if run.api_key else None} - {None}
        if user is None or user.pk in starter_ids:
            raise ApprovalRefused("You started this run, so someone else must decide its calls.", 403)
        if request.decisions.filter(user=user).exists():
            raise ApprovalRefused("You already approved this request; it needs a different second approver.", 409)
        if seen_hash and seen_hash != request.current_hash:
            raise ApprovalRefused("The arguments were edited by another approver since you looked; review the current "
                                  "version and decide again.", 409)
        edit = _edit(request, arguments, approve)
        ApprovalDecision.objects.create(
            tenant_id=request.tenant_id, request=request, user=user, approved=approve, note=note[:2000], via=via,
            arguments_hash=request.current_hash, edited=edit,
        )
        approvals = request.decisions.filter(approved=True, arguments_hash=request.current_hash).count()
        if not approve:
            request.status = ApprovalStatus.REJECTED
        elif approvals >= request.required_approvals:
            request.status = ApprovalStatus.APPROVED
        if request.status in FINAL:
            metrics.record_decision(request.status)
            request.decided_at = timezone.now()
            request.save(update_fields=["status", "decided_at"])
            record_change(
                tenant=request.tenant,
                actor=user,
                action=f"approval.{request.status}",
                target=request,
                details={"tool": request.tool_name, "run": str(request.run_id), "note": note[:500], "via": via,
                         **edits.audit_details(request)},
            )
            transaction.on_commit(lambda: resume_run(request.run_id))
        else:
            record_change(
                tenant=request.tenant,
                actor=user,
                action="approval.first_approval",
                target=request,
                details={"tool": request.tool_name, "run": str(request.run_id), "via": via, **edits.audit_details(request)},
            )
        publish(request)
        return request


def _edit(request: ApprovalRequest, arguments: dict[str, Any] | None, approve: bool) -> bool:
    """Apply an approver's edit to the locked request (validated, allowed by policy); whether anything changed."""
    if arguments is None:
        return False
    if not approve:
        raise edits.EditInvalid(["arguments: only an approval can edit the arguments; leave them out to reject"])
    if not edits.edits_allowed(request):
        raise ApprovalRefused(f"The policy of {request.tool_name} does not allow approvers to edit its arguments; "
                              "approve or reject the call as it stands.", 403)
    edit = edits.prepare(request, arguments)
    if edit is None:
        return False
    if request.decisions.filter(approved=True).exists() or request.edited_arguments is not None:
        raise ApprovalRefused("A first approver already approved these arguments; a second approver cannot change them. "
                              "Approve them as they stand, or reject with a note saying what is wrong.", 409)
    request.edited_arguments = edit.arguments
    request.edited_hash = edit.hash
    request.preview = {**(request.preview or {}), "edited_arguments": edits.audit_details(request)["edited_arguments"],
                       "changes": edit.changes}
    fields = ["edited_arguments", "edited_hash", "preview"]
    if edit.four_eyes and request.required_approvals < 2:
        request.required_approvals = 2  # the edited call needs two people by the tool's rule
        fields.append("required_approvals")
    request.save(update_fields=fields)
    return True


def expire(request: ApprovalRequest) -> bool:
    """Mark an overdue request expired and let its run go on (the model hears "approval expired").

    The conditional UPDATE claims the row: of two expiries at once (two beats) only one expires it,
    audits it and resumes its run. Returns whether this call did."""
    updated = ApprovalRequest.objects.filter(pk=request.pk, status=ApprovalStatus.PENDING).update(
        status=ApprovalStatus.EXPIRED, decided_at=timezone.now()
    )
    request.status = ApprovalStatus.EXPIRED
    if updated:
        metrics.record_decision(ApprovalStatus.EXPIRED)
        record_change(
            tenant=request.tenant,
            actor=None,
            action="approval.expired",
            target=request,
            details={"tool": request.tool_name, "run": str(request.run_id)},
        )
        run_id = request.run_id
        transaction.on_commit(lambda: resume_run(run_id))
        publish(request)
    return bool(updated)


def expire_due() -> int:
    """Expire every overdue pending request (the periodic task); returns how many this call expired."""
    count = 0
    for request in ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=timezone.now()).select_related("tenant"):
        with transaction.atomic():
            count += expire(request)
    return count


def cancel_for_run(run: Any) -> None:
    """A cancelled run's pending requests are cancelled too. Call inside the cancelling transaction."""
    for request in ApprovalRequest.objects.filter(run_id=run.pk, status=ApprovalStatus.PENDING):
        request.status = ApprovalStatus.CANCELLED
        request.decided_at = timezone.now()
        request.save(update_fields=["status", "decided_at"])
        publish(request)


def resume_run(run_id: Any) -> bool:
    """Re-enqueue a waiting run whose requests are all decided (through the agents app's handler). Safe to call twice."""
    if ApprovalRequest.objects.filter(run_id=run_id, status=ApprovalStatus.PENDING).exists():
        return False
    resume = handlers.agents.resume_waiting_run
    return bool(resume is not None and resume(run_id))


def publish(request: ApprovalRequest) -> None:
    summary = summarize(request)
    tenant_id = request.tenant_id
    transaction.on_commit(lambda: live.publish_approval(tenant_id=tenant_id, summary=summary))


def summarize(request: ApprovalRequest) -> dict[str, Any]:
    return {
        "id": str(request.pk),
        "status": request.status,
        "tool": request.tool_name,
        "run": str(request.run_id),
        "requested_at": request.requested_at.isoformat() if request.requested_at else None,
        "expires_at": request.expires_at.isoformat(),
        "required_approvals": request.required_approvals,
        "edited": bool(request.edited_hash),
    }

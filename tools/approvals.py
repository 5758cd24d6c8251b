"""Human approvals: the policy that says when, the gate in the tool pipeline, and the decisions.

A call that needs approval creates exactly one ApprovalRequest (per run and tool call id), the
run pauses in WAITING and its task ends. A decision (or expiry) re-enqueues the run; the resumed
step offers the call to the gateway again, and this gate lets it through (approved, exactly
once, with the arguments that were approved), or answers it for the model (rejected, expired).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agents import metrics
from agents.runtime.types import ToolCall, ToolContext, ToolStatus
from audit.masking import mask_value
from audit.services import record_change
from tenants.scoping import Actor
from tools.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, Tool, ToolKind

log = logging.getLogger(__name__)

DEFAULT_EXPIRY_SECONDS = 3600
DEFAULT_APPROVER_ROLES = ("owner", "approver")
OPERATORS = (">", ">=", "<", "<=", "==", "!=", "in", "not in")
FINAL = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED, ApprovalStatus.CANCELLED)


# -- policy --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApprovalRule:
    needed: bool
    reason: str = ""
    expires_in: int = DEFAULT_EXPIRY_SECONDS
    approver_roles: tuple[str, ...] = DEFAULT_APPROVER_ROLES
    four_eyes: bool = False


def policy_errors(policy: Any) -> list[str]:
    """Readable problems with an approval policy document; empty when it is valid."""
    if policy in (None, {}):
        return []
    if not isinstance(policy, dict):
        return ['approval_policy: must be an object, e.g. {"mode": "always"}']
    errors: list[str] = []
    known = {"mode", "condition", "conditions", "expires_in_seconds", "approver_roles", "four_eyes"}
    for key in sorted(set(policy) - known):
        errors.append(f"approval_policy.{key}: unknown field; expected one of {', '.join(sorted(known))}")
    mode = policy.get("mode", "always")
    if mode not in ("always", "never", "condition"):
        errors.append(f"approval_policy.mode: must be always, never or condition, got {mode!r}")
    conditions = _conditions(policy)
    if mode == "condition" and not conditions:
        errors.append('approval_policy.condition: required when mode is condition, e.g. {"field": "amount", "op": ">", "value": 100}')
    for i, cond in enumerate(conditions):
        where = f"approval_policy.conditions[{i}]"
        if not isinstance(cond, dict) or not isinstance(cond.get("field"), str) or cond.get("op") not in OPERATORS or "value" not in cond:
            errors.append(f'{where}: must be {{"field": <argument name>, "op": one of {" ".join(OPERATORS)}, "value": ...}}')
    expires = policy.get("expires_in_seconds", DEFAULT_EXPIRY_SECONDS)
    if not isinstance(expires, int) or isinstance(expires, bool) or not 10 <= expires <= 30 * 86400:
        errors.append(f"approval_policy.expires_in_seconds: must be an integer between 10 and 2592000, got {expires!r}")
    roles = policy.get("approver_roles", list(DEFAULT_APPROVER_ROLES))
    if not isinstance(roles, list) or not roles or any(r not in ("owner", "operator", "approver") for r in roles):
        errors.append(f"approval_policy.approver_roles: must be a non-empty list of owner, operator, approver; got {roles!r}")
    if not isinstance(policy.get("four_eyes", False), bool):
        errors.append("approval_policy.four_eyes: must be true or false")
    return errors


def _conditions(policy: dict[str, Any]) -> list[Any]:
    if "conditions" in policy:
        return list(policy["conditions"] or [])
    return [policy["condition"]] if policy.get("condition") else []


def _number(value: Any) -> Decimal | None:
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


def _holds(cond: dict[str, Any], arguments: dict[str, Any]) -> bool:
    actual, op, expected = arguments.get(cond["field"]), cond["op"], cond["value"]
    if op in ("in", "not in"):
        inside = actual in (expected if isinstance(expected, list) else [expected])
        return inside if op == "in" else not inside
    a, b = _number(actual), _number(expected)
    if a is not None and b is not None:
        actual, expected = a, b
    try:
        return {
            ">": actual > expected,
            ">=": actual >= expected,
            "<": actual < expected,
            "<=": actual <= expected,
            "==": actual == expected,
            "!=": actual != expected,
        }[op]
    except TypeError:
        return True  # not comparable (e.g. missing): ask a human rather than guess


def rule_for(tool: Tool, arguments: dict[str, Any], override: dict[str, Any] | None = None) -> ApprovalRule:
    policy = {**(tool.approval_policy or {}), **(override or {})}
    mode = policy.get("mode") or ("always" if tool.requires_approval else "never")
    if mode == "never":
        return ApprovalRule(False)
    if mode == "condition":
        met = [c for c in _conditions(policy) if _holds(c, arguments)]
        if not met:
            return ApprovalRule(False)
        reason = "; ".join(f"{c['field']} {c['op']} {c['value']}" for c in met)
    else:
        reason = "this tool always needs approval"
    return ApprovalRule(
        True,
        reason,
        expires_in=int(policy.get("expires_in_seconds", DEFAULT_EXPIRY_SECONDS)),
        approver_roles=tuple(policy.get("approver_roles", DEFAULT_APPROVER_ROLES)),
        four_eyes=bool(policy.get("four_eyes", False)),
    )


def render_preview(tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
    """What will happen, for the approver: for HTTP tools the method and URL filled in, headers masked."""
    sensitive = tool.sensitive_fields or ()
    preview: dict[str, Any] = {
        "tool": tool.name,
        "description": tool.description.split("\n")[0][:300],
        "arguments": mask_value(arguments, sensitive),
    }
    if tool.kind == ToolKind.HTTP:
        from tools.executors import http_spec
        from tools.http_exec import render_request

        try:
            preview["request"] = render_request(http_spec(tool), arguments, sensitive_fields=sensitive).preview
        except Exception as exc:  # a preview must never block the request; say why it is missing
            preview["request_error"] = str(exc)
    return preview


# -- the gate in the tool pipeline -----------------------------------------------------------


@dataclass
class GateDecision:
    proceed: bool
    status: ToolStatus = ToolStatus.OK
    message: str = ""
    trace: dict[str, Any] = field(default_factory=dict)


class ApprovalGate:
    def __init__(self, run: Any, overrides: dict[str, dict[str, Any]] | None = None) -> None:
        self.run = run
        self.overrides = overrides or {}

    def gate(self, *, tool: Tool, call: ToolCall, ctx: ToolContext, arguments: dict[str, Any], args_hash: str) -> GateDecision | None:
        override = self.overrides.get(tool.name)
        rule = rule_for(tool, arguments, override)
        if not rule.needed and not (tool.requires_approval or tool.approval_policy or override):
            return None  # a tool that can never need approval: no lookup on the hot path
        existing = (
            ApprovalRequest.objects.filter(run_id=self.run.pk)
            .filter(Q(call_id=call.id[:100]) | Q(tool_name=tool.name, arguments_hash=args_hash, step=ctx.step))
            .order_by("requested_at")
            .first()
        )
        if existing is None:
            if not rule.needed:
                return None
            request = self._create(tool, call, ctx, arguments, args_hash, rule)
            return GateDecision(
                False,
                ToolStatus.PENDING_APPROVAL,
                f"The call to {tool.name} needs a person's approval ({rule.reason}); it has not run yet.",
                {"approval_id": str(request.pk), "reason": rule.reason, "expires_at": request.expires_at.isoformat()},
            )
        trace = {"approval_id": str(existing.pk), "approval_status": existing.status}
        if existing.status == ApprovalStatus.PENDING and existing.expires_at <= timezone.now():
            expire(existing)
        if existing.status == ApprovalStatus.PENDING:
            return GateDecision(False, ToolStatus.PENDING_APPROVAL, f"The call to {tool.name} is still waiting for approval.", trace)
        if existing.status == ApprovalStatus.APPROVED:
            if existing.arguments_hash != args_hash:
                return GateDecision(
                    False, ToolStatus.DENIED, "The arguments differ from the ones that were approved; the call was not made.", trace
                )
            return GateDecision(True, trace=trace)
        if existing.status == ApprovalStatus.REJECTED:
            note = existing.decisions.filter(approved=False).values_list("note", flat=True).first() or "no reason given"
            return GateDecision(
                False,
                ToolStatus.REJECTED,
                f"rejected by an approver: {note}. The call was not made; tell the user and do not retry it.",
                trace,
            )
        if existing.status == ApprovalStatus.EXPIRED:
            return GateDecision(
                False,
                ToolStatus.REJECTED,
                "approval expired: nobody decided in time, so the call was not made. Tell the user it can be requested again.",
                trace,
            )
        return GateDecision(False, ToolStatus.DENIED, "The approval request was cancelled; the call was not made.", trace)

    def _create(
        self, tool: Tool, call: ToolCall, ctx: ToolContext, arguments: dict[str, Any], args_hash: str, rule: ApprovalRule
    ) -> ApprovalRequest:
        request, _created = ApprovalRequest.objects.get_or_create(
            run_id=self.run.pk,
            call_id=call.id[:100],
            defaults={
                "tenant_id": self.run.tenant_id,
                "step": ctx.step,
                "tool": tool,
                "tool_name": tool.name,
                "arguments": arguments,
                "arguments_hash": args_hash,
                "preview": render_preview(tool, arguments),
                "required_approvals": 2 if rule.four_eyes else 1,
                "approver_roles": list(rule.approver_roles),
                "expires_at": timezone.now() + dt.timedelta(seconds=rule.expires_in),
            },
        )
        publish(request)
        return request


# -- decisions -----------------------------------------------------------------------------


class ApprovalRefused(Exception):
    """A decision that cannot be taken. ``status`` is the HTTP status that fits (403, 404, 409)."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


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


def decide(*, actor: Actor, request_id: Any, approve: bool, note: str = "", via: str = "page") -> ApprovalRequest:
    """Approve or reject. Refuses self-approval, foreign tenants (404), and requests no longer pending."""
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
        ApprovalDecision.objects.create(
            tenant_id=request.tenant_id, request=request, user=user, approved=approve, note=note[:2000], via=via
        )
        approvals = request.decisions.filter(approved=True).count()
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
                details={"tool": request.tool_name, "run": str(request.run_id), "note": note[:500], "via": via},
            )
            transaction.on_commit(lambda: resume_run(request.run_id))
        else:
            record_change(
                tenant=request.tenant,
                actor=user,
                action="approval.first_approval",
                target=request,
                details={"tool": request.tool_name, "run": str(request.run_id), "via": via},
            )
        publish(request)
        return request


def expire(request: ApprovalRequest) -> None:
    """Mark an overdue request expired and let its run go on (the model hears "approval expired")."""
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


def expire_due() -> int:
    """Expire every overdue pending request (the periodic task)."""
    count = 0
    for request in ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=timezone.now()).select_related("tenant"):
        with transaction.atomic():
            expire(request)
        count += 1
    return count


def cancel_for_run(run: Any) -> None:
    """A cancelled run's pending requests are cancelled too. Call inside the cancelling transaction."""
    for request in ApprovalRequest.objects.filter(run_id=run.pk, status=ApprovalStatus.PENDING):
        request.status = ApprovalStatus.CANCELLED
        request.decided_at = timezone.now()
        request.save(update_fields=["status", "decided_at"])
        publish(request)


def resume_run(run_id: Any) -> bool:
    """Re-enqueue a waiting run whose requests are all decided. Safe to call twice."""
    from agents.models import Run, RunStatus
    from agents.services import enqueue_run

    if ApprovalRequest.objects.filter(run_id=run_id, status=ApprovalStatus.PENDING).exists():
        return False
    with transaction.atomic():
        if Run.objects.filter(pk=run_id, status=RunStatus.WAITING, lease_token="").update(status=RunStatus.QUEUED):
            enqueue_run(run_id)
            return True
    return False


def publish(request: ApprovalRequest) -> None:
    from agents import live

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
    }

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
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.masking import mask_value
from audit.models import ConfigChange
from audit.services import record_change
from config import live
from runtime.approval_policy import (
    DEFAULT_APPROVER_ROLES,
    DEFAULT_EXPIRY_SECONDS,
    describe,
    flagged,
    holds,
    looser_fields,
    normalise,
    stricter,
    strip_flag,
)
from runtime.approval_policy import policy_errors as policy_errors
from runtime.types import ToolCall, ToolContext, ToolStatus
from tenants.scoping import Actor
from tools import handlers, metrics
from tools.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, Tool, ToolKind

log = logging.getLogger(__name__)

FINAL = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED, ApprovalStatus.CANCELLED)
#: The config-change action that records a tenant owner loosening a tool's approval floor for one agent version.
FLOOR_OVERRIDE_ACTION = "agent_version.approval_floor_overridden"


# -- policy --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApprovalRule:
    needed: bool
    reason: str = ""
    expires_in: int = DEFAULT_EXPIRY_SECONDS
    approver_roles: tuple[str, ...] = DEFAULT_APPROVER_ROLES
    four_eyes: bool = False


def declared_policy(tool: Tool) -> dict[str, Any] | None:
    """What the plugin that provides ``tool`` declares for it (normalised); None for a tenant's own tool."""
    if tool.plugin_install_id is None:
        return None
    plugin = tool.plugin_install.plugin if tool.plugin_install is not None else None
    entry = next((e for e in (plugin.tools if plugin is not None else []) if isinstance(e, dict) and e.get("name") == tool.name), None)
    if entry is None:
        return normalise({"mode": "always"})  # a plugin tool whose declaration cannot be found: ask a person
    declared = entry.get("approval_policy") if isinstance(entry.get("approval_policy"), dict) else None
    return normalise(declared, requires_approval=bool(entry.get("requires_approval")))


def floor_for(tool: Tool, declared: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tool's own approval policy, the floor no agent version may loosen: its row, and its plugin's declaration."""
    own = normalise(tool.approval_policy, requires_approval=tool.requires_approval)
    declared = declared if declared is not None else declared_policy(tool)
    return stricter(declared, own) if declared is not None else own


def version_policy(tool: Tool, entry: dict[str, Any]) -> dict[str, Any]:
    """An agent version's entry for the tool, over the tool's row (normalised)."""
    return normalise({**(tool.approval_policy or {}), **strip_flag(entry)}, requires_approval=tool.requires_approval)


def loosening(tool: Tool, entry: dict[str, Any], *, path: str) -> list[str]:
    """Each way a version's entry is looser than the tool's floor, as ``path.field: ...``."""
    return looser_fields(floor_for(tool), version_policy(tool, entry), path=path)


def recorded_overrides(*, tenant_id: Any, version_id: Any) -> dict[str, list[Any]]:
    """The entries (by tool name) that the tenant's owner explicitly loosened for this version (config-change rows)."""
    found: dict[str, list[Any]] = {}
    if version_id is None:
        return found
    rows = ConfigChange.objects.filter(tenant_id=tenant_id, action=FLOOR_OVERRIDE_ACTION, target_type="AgentVersion",
                                       target_id=str(version_id)).values_list("details", flat=True)
    for details in rows:
        if isinstance(details, dict) and isinstance(details.get("tool"), str):
            found.setdefault(details["tool"], []).append(details.get("after"))
    return found


def rule_for(tool: Tool, arguments: dict[str, Any], override: dict[str, Any] | None = None, *,
             declared: dict[str, Any] | None = None, owner_override: bool = False) -> ApprovalRule:
    """The rule for one call: the stricter of the tool's floor and the version's entry ``override``,
    or the entry alone when the tenant's owner loosened the floor for it (``owner_override``)."""
    floor = floor_for(tool, declared)
    if override:
        mine = version_policy(tool, override)
        policy = mine if owner_override else stricter(floor, mine)
    else:
        policy = floor
    if policy["mode"] == "never":
        return ApprovalRule(False)
    if policy["mode"] == "condition":
        met = [c for c in policy["conditions"] if holds(c, arguments)]
        if not met:
            return ApprovalRule(False)
        reason = "; ".join(describe(c) for c in met)
    else:
        reason = "this tool always needs approval"
    return ApprovalRule(
        True,
        reason,
        expires_in=policy["expires_in_seconds"],
        approver_roles=tuple(policy["approver_roles"]),
        four_eyes=policy["four_eyes"],
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
    """``overrides`` are the version's per-tool entries (``policy.approvals.tools``). Each is held to the tool's
    floor here too, at run time, so a version row that never went through the service cannot loosen it either:
    only an entry the tenant's owner loosened explicitly (a recorded config change for this version) is taken as is."""

    def __init__(self, run: Any, overrides: dict[str, dict[str, Any]] | None = None) -> None:
        self.run = run
        self.overrides = overrides or {}
        self._declared: dict[Any, dict[str, Any] | None] = {}
        self._recorded: dict[str, list[Any]] | None = None

    def _owner_override(self, tool: Tool, entry: dict[str, Any] | None) -> bool:
        if not entry or not flagged(entry):
            return False
        if self._recorded is None:
            self._recorded = recorded_overrides(tenant_id=self.run.tenant_id, version_id=getattr(self.run, "version_id", None))
        return entry in self._recorded.get(tool.name, [])

    def gate(self, *, tool: Tool, call: ToolCall, ctx: ToolContext, arguments: dict[str, Any], args_hash: str) -> GateDecision | None:
        override = self.overrides.get(tool.name)
        if tool.pk not in self._declared:
            self._declared[tool.pk] = declared_policy(tool)
        declared = self._declared[tool.pk]
        rule = rule_for(tool, arguments, override, declared=declared, owner_override=self._owner_override(tool, override))
        declares = declared is not None and declared["mode"] != "never"
        if not rule.needed and not (tool.requires_approval or tool.approval_policy or override or declares):
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
    }

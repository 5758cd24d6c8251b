"""The approval gate in the tool pipeline.

A call that needs approval creates exactly one ApprovalRequest (per run and tool call id), the
run pauses in WAITING and its task ends. A decision (or expiry) re-enqueues the run; the resumed
step offers the call to the gateway again, and this gate lets it through (approved, exactly
once, with the arguments that were approved), or answers it for the model (rejected, expired).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q
from django.utils import timezone

from approvals.decisions import expire, publish
from approvals.edits import change_list, model_note
from approvals.models import ApprovalRequest, ApprovalStatus, NotifyEvent
from approvals.policy import ApprovalRule, declared_policy, recorded_overrides, render_preview, rule_for
from approvals.tasks import enqueue_notice
from audit.masking import mask_text
from runtime.approval_policy import flagged
from runtime.types import ToolCall, ToolContext, ToolStatus
from tools.arguments import arguments_hash
from tools.models import Tool


@dataclass
class GateDecision:
    proceed: bool
    status: ToolStatus = ToolStatus.OK
    message: str = ""
    trace: dict[str, Any] = field(default_factory=dict)
    #: An approver's edit: the call runs with exactly these arguments (bound by ``args_hash``); ``message`` is the model's note.
    arguments: dict[str, Any] | None = None
    args_hash: str = ""


def decision_trace(request: ApprovalRequest) -> dict[str, Any]:
    """Who decided and with what note, for the run's trace: ``decided_by`` ("alice, bob"), ``decision_note`` and one
    entry per decision. Notes are masked like any free text in a trace (an approver may paste a phone number)."""
    decisions = [
        {"by": d.user.get_username() if d.user is not None else "(deleted user)", "approved": d.approved,
         "note": mask_text(d.note), "via": d.via, "at": d.at.isoformat()}
        for d in request.decisions.all()
    ]
    notes = [d["note"] for d in decisions if d["note"]]
    return {
        "decided_by": ", ".join(d["by"] for d in decisions),
        "decision_note": " / ".join(notes),
        "decisions": decisions,
    }


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

    def requested(self, *, call_id: str, tool_name: str, args_hash: str, step: int) -> bool:
        """Whether this call (or the same call replayed in this step) already asked for approval."""
        return ApprovalRequest.objects.filter(run_id=self.run.pk).filter(
            Q(call_id=call_id) | Q(tool_name=tool_name, arguments_hash=args_hash, step=step)
        ).exists()

    def rule(self, tool: Tool, arguments: dict[str, Any]) -> ApprovalRule:
        """The approval rule for one call of ``tool`` in this run (the gate's decision, and the impact preview's)."""
        override = self.overrides.get(tool.name)
        if tool.pk not in self._declared:
            self._declared[tool.pk] = declared_policy(tool)
        return rule_for(tool, arguments, override, declared=self._declared[tool.pk],
                        owner_override=self._owner_override(tool, override))

    def gate(self, *, tool: Tool, call: ToolCall, ctx: ToolContext, arguments: dict[str, Any], args_hash: str) -> GateDecision | None:
        override = self.overrides.get(tool.name)
        rule = self.rule(tool, arguments)
        declared = self._declared[tool.pk]
        declares = declared is not None and declared["mode"] != "never"
        if not rule.needed and not (tool.requires_approval or tool.approval_policy or override or declares):
            return None  # a tool that can never need approval: no lookup on the hot path
        existing = (
            ApprovalRequest.objects.filter(run_id=self.run.pk)
            .prefetch_related("decisions__user")
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
        trace: dict[str, Any] = {"approval_id": str(existing.pk), "approval_status": existing.status}
        if existing.status == ApprovalStatus.PENDING and existing.expires_at <= timezone.now():
            expire(existing)
            trace["approval_status"] = existing.status
        if existing.status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED):
            trace.update(decision_trace(existing))
        if existing.status == ApprovalStatus.PENDING:
            return GateDecision(False, ToolStatus.PENDING_APPROVAL, f"The call to {tool.name} is still waiting for approval.", trace)
        if existing.status == ApprovalStatus.APPROVED:
            if existing.arguments_hash != args_hash:
                return GateDecision(
                    False, ToolStatus.DENIED, "The arguments differ from the ones that were approved; the call was not made.", trace
                )
            return self._approved(tool, existing, args_hash, trace)
        if existing.status == ApprovalStatus.REJECTED:
            note = next((d.note for d in existing.decisions.all() if not d.approved), "") or "no reason given"
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

    def _approved(self, tool: Tool, request: ApprovalRequest, args_hash: str, trace: dict[str, Any]) -> GateDecision:
        """Let an approved call through with exactly the arguments every approval was given for (edited or not)."""
        bound = [d.arguments_hash for d in request.decisions.all() if d.approved]
        if request.edited_arguments is None:
            if any(h and h != args_hash for h in bound):
                return GateDecision(False, ToolStatus.DENIED, "The arguments differ from the ones that were approved; "
                                    "the call was not made.", trace)
            return GateDecision(True, trace=trace)
        edited_hash = arguments_hash(request.edited_arguments)
        if edited_hash != request.edited_hash or not bound or any(h != edited_hash for h in bound):
            trace["edited"] = True
            return GateDecision(False, ToolStatus.DENIED, "The edited arguments do not match the ones that were approved; "
                                "the call was not made. Tell the user an operator has to look at it.", trace)
        changes = change_list(tool.sensitive_fields, request.arguments, request.edited_arguments)
        trace.update(edited=True, changes=changes, edited_hash=edited_hash)
        return GateDecision(True, message=model_note(tool.name, changes), trace=trace,
                            arguments=dict(request.edited_arguments), args_hash=edited_hash)

    def _create(
        self, tool: Tool, call: ToolCall, ctx: ToolContext, arguments: dict[str, Any], args_hash: str, rule: ApprovalRule
    ) -> ApprovalRequest:
        request, created = ApprovalRequest.objects.get_or_create(
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
        if created:
            enqueue_notice(request.pk, NotifyEvent.ARRIVED)
        return request

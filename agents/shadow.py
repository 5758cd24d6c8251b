"""Policy shadow replay ("preview impact"): what a proposed, unsaved tool policy change would have done to the
recorded tool calls of the last days.

Each recorded call (``ToolCallAudit``) is decided twice — under the tool as it is and as proposed — by the gateway's
own decision code: the kill switch and the allow-list/scopes (:mod:`tools.decisions`), the rate limit (the same
bucket, :class:`llm.ratelimit.LocalBucketStore`, driven by the recorded timestamps), the approval rule
(:meth:`approvals.gate.ApprovalGate.rule`, with the version's overrides). A call whose verdict changes is counted
by tenant, agent and tool, with a few masked examples. The proposal goes through the tool service's checks first
(:func:`tools.services.check_change`), so a preview is refused exactly as saving would be. Nothing is written.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from agents import hooks
from agents.engine import approval_overrides, session_grants
from agents.models import Run
from approvals.gate import ApprovalGate
from audit.masking import mask_text
from audit.models import ToolCallAudit, ToolCallStatus
from llm.ratelimit import LocalBucketStore
from tenants.scoping import Actor, acting
from tools import decisions, services
from tools.models import Tool
from tools.services import ToolRefused

MAX_DAYS = 30
DEFAULT_DAYS = 7
CHUNK = 500
DEFAULT_CAP = 20_000
EXAMPLES = 5
PREVIEW_FIELDS = decisions.PREVIEW_FIELDS
#: Refused before any policy stage, whatever the policy: not replayed.
_SKIPPED = (ToolCallStatus.STARTED, ToolCallStatus.INVALID, ToolCallStatus.DUPLICATE_BLOCKED)
KINDS = {"denied": "newly_denied", "approval": "newly_needs_approval", "rate_limited": "newly_rate_limited",
         "allowed": "newly_allowed"}


def _days(value: Any) -> int:
    if value is None:
        return DEFAULT_DAYS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DAYS:
        raise ToolRefused(f"days must be a whole number from 1 to {MAX_DAYS}; got {value!r}.", field="days")
    return value


def _proposal(fields: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(fields) - set(PREVIEW_FIELDS))
    if unknown:
        raise ToolRefused(f"{unknown[0]} is not a policy field; a preview takes {', '.join(PREVIEW_FIELDS)}.", field=unknown[0])
    if "enabled" in fields and not isinstance(fields["enabled"], bool):
        raise ToolRefused(f"enabled must be true or false; got {fields['enabled']!r}.", field="enabled")
    if "requires_approval" in fields and not isinstance(fields["requires_approval"], bool):
        raise ToolRefused(f"requires_approval must be true or false; got {fields['requires_approval']!r}.", field="requires_approval")
    scopes = fields.get("required_scopes", [])
    if not isinstance(scopes, list) or not all(isinstance(s, str) and s for s in scopes):
        raise ToolRefused(f"required_scopes must be a list of scope names; got {scopes!r}.", field="required_scopes")
    if "approval_policy" in fields and not isinstance(fields["approval_policy"], dict):
        raise ToolRefused("approval_policy must be an object (empty follows requires_approval).", field="approval_policy")
    return fields


def _arguments(summary: str) -> dict[str, Any]:
    try:
        parsed = json.loads(summary)
    except ValueError:
        return {}  # shortened in the audit row: conditions on its fields are not met
    return parsed if isinstance(parsed, dict) else {}


class _Side:
    """One configuration of the tool (as it is, or as proposed) with its own rate-limit bucket on the replay clock."""

    def __init__(self, tool: Tool, clock: list[float]) -> None:
        self.tool = tool
        self.store = LocalBucketStore(clock=lambda: clock[0])

    def verdict(self, *, whitelist: list[str], grants: set[str], gate: ApprovalGate, arguments: dict[str, Any],
                counted: bool) -> tuple[str, str]:
        refusal = decisions.switched_off(self.tool) or decisions.not_authorized(self.tool, whitelist, grants)
        if refusal is not None:
            return "denied", refusal.reason
        if not counted and decisions.rate_limit_wait(self.store, self.tool.tenant_id, self.tool) > 0:
            return "rate_limited", f"over {self.tool.rate_limit_per_minute} calls per minute"
        rule = gate.rule(self.tool, arguments)
        if rule.needed:
            return "approval", rule.reason
        return "allowed", ""


def _empty() -> dict[str, Any]:
    return {"count": 0, "by_tenant": {}, "by_agent": {}, "by_tool": {}, "examples": []}


class _Replay:
    """What both previews share: the recorded calls read oldest first in keyset-paginated chunks of ``CHUNK`` with
    their runs (at most ``cap`` rows, then ``truncated``), each conversation's grants computed once per run, and the
    tally of the calls whose verdict changes."""

    def __init__(self, *, tenant_id: Any, cap: int, examples: int) -> None:
        self.cap, self.examples = cap, examples
        self.plugin_scopes = set(hooks.granted_scopes(tenant_id))
        self.impact = {kind: _empty() for kind in KINDS.values()}
        self.evaluated = self.not_evaluated = 0
        self.truncated = False
        self._grants: dict[Any, set[str]] = {}

    def rows(self, rows: QuerySet[Any, dict[str, Any]]) -> Iterator[tuple[dict[str, Any], Run | None]]:
        """Each row of ``rows`` (ordered by created_at, id) with its run (None when the run is gone)."""
        read = 0
        last: tuple[Any, Any] | None = None
        while True:
            page = rows if last is None else rows.filter(Q(created_at__gt=last[0]) | Q(created_at=last[0], id__gt=last[1]))
            chunk = list(page[:CHUNK])
            if not chunk:
                return
            last = (chunk[-1]["created_at"], chunk[-1]["id"])
            runs = Run.objects.select_related("tenant", "session", "version").in_bulk({r["run_id"] for r in chunk if r["run_id"]})
            for row in chunk:
                if read >= self.cap:
                    self.truncated = True
                    return
                read += 1
                yield row, runs.get(row["run_id"])

    def grants(self, run: Run) -> set[str]:
        """The conversation's scopes (:func:`agents.engine.session_grants`), once per run within this preview."""
        if run.pk not in self._grants:
            self._grants[run.pk] = session_grants(run, self.plugin_scopes)
        return self._grants[run.pk]

    def tally(self, row: dict[str, Any], *, was: str, now: str, why: str, tenant: str, tool: str) -> None:
        """Count ``row`` by tenant, agent and tool (with a few masked examples) if its verdict changed."""
        if was == now:
            return
        bucket = self.impact[KINDS[now]]
        bucket["count"] += 1
        for group, name in (("by_tenant", tenant), ("by_agent", row["agent__slug"] or "(deleted agent)"), ("by_tool", tool)):
            bucket[group][name] = bucket[group].get(name, 0) + 1
        if len(bucket["examples"]) < self.examples:
            bucket["examples"].append({
                "at": row["created_at"].isoformat(), "run": str(row["run_id"]), "agent": row["agent__slug"],
                "step": row["step"], "recorded_status": row["status"], "before": was, "after": now,
                "reason": why, "arguments": mask_text(row["arguments_summary"]),
            })

    def result(self, *, tool: str, tenant: str, days: int, since: Any, changed: list[str]) -> dict[str, Any]:
        cap, truncated = self.cap, self.truncated
        return {
            "tool": tool, "tenant": tenant, "days": days, "since": since.isoformat(), "changed": changed,
            "calls_evaluated": self.evaluated, "calls_not_evaluated": self.not_evaluated,
            "truncated": truncated, "truncated_at": cap if truncated else None,
            "note": f"truncated at {cap} calls: later calls were not replayed" if truncated else "",
            **self.impact,
        }


def preview_tool_change(*, tool: Tool, actor: Actor | None, fields: dict[str, Any], days: Any = None,
                        cap: int = DEFAULT_CAP, examples: int = EXAMPLES) -> dict[str, Any]:
    """The impact of changing ``tool``'s policy to ``fields`` on its recorded calls of the last ``days`` (at most
    ``cap`` calls, read oldest first in chunks). Raises :class:`ToolRefused` (a 400 naming the field) like saving."""
    acting(actor).require("operate", tool.tenant_id)
    span = _days(days)
    fields = _proposal(dict(fields))
    current = Tool.objects.select_related("tenant", "plugin_install__plugin").get(pk=tool.pk)
    changed = services.check_change(current=current, actor=actor, fields=fields)
    proposed = copy.copy(current)
    for name in changed:
        setattr(proposed, name, fields[name])
    clock = [0.0]
    before, after = _Side(current, clock), _Side(proposed, clock)
    since = timezone.now() - timedelta(days=span)
    replay = _Replay(tenant_id=current.tenant_id, cap=cap, examples=examples)
    gates: dict[Any, ApprovalGate] = {}
    seen: set[tuple[Any, str]] = set()
    rows = (ToolCallAudit.objects.filter(tenant_id=current.tenant_id, tool_name=current.name, created_at__gte=since)
            .exclude(status__in=_SKIPPED).order_by("created_at", "id")
            .values("id", "created_at", "run_id", "version_id", "agent__slug", "step", "call_id", "status",
                    "arguments_summary"))
    for row, run in replay.rows(rows):
        if run is None:
            replay.not_evaluated += 1  # the run is gone: its version's tool list and grants are unknown
            continue
        replay.evaluated += 1
        if run.version_id not in gates:
            gates[run.version_id] = ApprovalGate(run, overrides=approval_overrides(run))
        key = (row["run_id"], row["call_id"])
        counted = key in seen  # a call already admitted (its approval, then its run) takes one token, as live
        seen.add(key)
        clock[0] = row["created_at"].timestamp()
        context = dict(whitelist=[n for n in run.version.tools if isinstance(n, str)], grants=replay.grants(run),
                       gate=gates[run.version_id], arguments=_arguments(row["arguments_summary"]), counted=counted)
        was, _ = before.verdict(**context)
        now, why = after.verdict(**context)
        replay.tally(row, was=was, now=now, why=why, tenant=current.tenant.slug, tool=current.name)
    return replay.result(tool=current.name, tenant=current.tenant.slug, days=span, since=since, changed=changed)


#: The fields of an agent version a preview may propose: its tool list (the allow-list) and its policy document.
VERSION_FIELDS = ("tools", "policy")


def preview_version_change(*, version: Any, actor: Actor, fields: dict[str, Any], days: Any = None,
                           cap: int = DEFAULT_CAP, examples: int = EXAMPLES) -> dict[str, Any]:
    """The impact of changing ``version``'s tool list or policy (approval overrides...) on the calls its runs made.

    Validated like saving (the model's checks, the approval floors). The rate limit is per tenant and tool, not per
    version, and is left out of this replay (a version change does not move it)."""
    from django.core.exceptions import ValidationError

    from agents.services import approval_floor_errors
    from runtime.config import PolicyError

    actor.require("operate", version.tenant_id)
    span = _days(days)
    unknown = sorted(set(fields) - set(VERSION_FIELDS))
    if unknown:
        raise ToolRefused(f"{unknown[0]} is not a field a preview takes; it takes {', '.join(VERSION_FIELDS)}.", field=unknown[0])
    candidate = copy.copy(version)
    changed = sorted(k for k, v in fields.items() if getattr(version, k) != v)
    for name in changed:
        setattr(candidate, name, fields[name])
    candidate.full_clean()
    if candidate.is_locked:  # runs used it: ``clean`` leaves history as it is, but the change is checked as new
        candidate.check_contents()
    floor = approval_floor_errors(actor=actor, version=candidate, before=version.policy)
    if floor:
        raise ValidationError({"policy": floor})
    since = timezone.now() - timedelta(days=span)
    replay = _Replay(tenant_id=version.tenant_id, cap=cap, examples=examples)
    clock = [0.0]
    gates: dict[str, ApprovalGate] = {}
    rows = (ToolCallAudit.objects.filter(tenant_id=version.tenant_id, version_id=version.pk, created_at__gte=since)
            .exclude(status__in=_SKIPPED).order_by("created_at", "id")
            .values("id", "created_at", "run_id", "tool_name", "agent__slug", "step", "status", "arguments_summary"))
    tools = {t.name: t for t in Tool.objects.filter(tenant_id=version.tenant_id).select_related("plugin_install__plugin")}
    sides: dict[str, tuple[_Side, _Side]] = {}
    for row, run in replay.rows(rows):
        tool = tools.get(row["tool_name"])
        if run is None or tool is None:
            replay.not_evaluated += 1  # the run or the tool is gone
            continue
        replay.evaluated += 1
        if not gates:
            shadow_run = copy.copy(run)
            shadow_run.version, shadow_run._runtime_policy = candidate, None
            try:
                proposed_overrides = approval_overrides(shadow_run)
            except PolicyError as exc:
                raise ValidationError({"policy": [str(exc)]}) from None
            gates = {"before": ApprovalGate(run, overrides=approval_overrides(run)),
                     "after": ApprovalGate(shadow_run, overrides=proposed_overrides)}
        before, after = sides.setdefault(tool.name, (_Side(tool, clock), _Side(tool, clock)))
        common = dict(grants=replay.grants(run), arguments=_arguments(row["arguments_summary"]), counted=True)
        was, _ = before.verdict(whitelist=[n for n in version.tools if isinstance(n, str)], gate=gates["before"], **common)
        now, why = after.verdict(whitelist=[n for n in candidate.tools if isinstance(n, str)], gate=gates["after"], **common)
        replay.tally(row, was=was, now=now, why=why, tenant=version.agent.tenant.slug, tool=tool.name)
    return replay.result(tool="", tenant=version.agent.tenant.slug, days=span, since=since, changed=changed)

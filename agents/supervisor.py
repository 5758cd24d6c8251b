"""Supervisor runs: route the request to a sub-agent (``policy.supervisor``, :mod:`runtime.supervisor`) and run it as
a child run, linked to the parent as agent-kind tools' children are (:func:`agents.child_runs.run_as_child`).

The parent's trace gets a ``supervisor.route`` event (committed before the child starts: mode, chosen sub-agent,
why — the rule and what it matched, the model's choice, or the fallback and why — and the child run's id), then
``supervisor.child_finished`` and ``run.finished`` with the child's answer as the parent's output. Rules make no
model call; ``llm`` makes one through the tenant's model gateway (the deterministic planner in embedded mode).
"""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents import services
from agents.child_runs import resume_child, run_as_child
from agents.models import Agent, AgentKind, Run, RunEvent, RunStatus
from agents.run_policy import policy_for
from agents.store import event_rows, publish_after_commit, run_summary
from audit.masking import mask_text
from llm.errors import ModelError
from llm.intent import CONCEPTS, mentions
from runtime.supervisor import Route, SupervisorPolicy, fallback_route, route_by_rules, route_choices, route_from_response
from runtime.types import Event, ModelRequest, TerminalReason
from tools.agent_exec import MAX_AGENT_DEPTH

#: The fact a supervisor waiting for its child run names the child by (``agents.services.resume_waiting_run``).
AWAITING_CHILD = "awaiting_child"

ROUTING_PROMPT = ("You are a router. Choose exactly one sub-agent for the user's request by calling its route_to_* "
                  "function. Do not answer the request yourself.")


def sub_agent_errors(section: dict[str, Any], *, tenant_id: Any, own_slug: str, is_flow: bool) -> list[str]:
    """Save-time checks that need the database: every slug is an agent (not a flow) of this tenant, not the supervisor
    itself; intents are concepts the router knows. Paths start at ``policy``."""
    if is_flow:
        return ["policy.supervisor: a flow cannot be a supervisor; use a flow's agent nodes instead"]
    named: list[tuple[str, str]] = []
    for index, entry in enumerate(section.get("sub_agents") or []):
        if isinstance(entry, dict) and isinstance(entry.get("agent"), str):
            named.append((f"policy.supervisor.sub_agents[{index}].agent", entry["agent"]))
    kinds = dict(Agent.objects.for_tenant(tenant_id).filter(slug__in=[s for _, s in named]).values_list("slug", "kind"))
    errors = []
    for path, slug in named:
        if slug == own_slug:
            errors.append(f"{path}: a supervisor cannot name itself as a sub-agent, got {slug!r}")
        elif slug not in kinds:
            errors.append(f"{path}: unknown agent {slug!r}; name an agent of this tenant")
        elif kinds[slug] == AgentKind.FLOW:
            errors.append(f"{path}: {slug!r} is a flow; only agents can be sub-agents")
    for index, rule in enumerate(section.get("rules") or []):
        for concept in (rule.get("intent") or []) if isinstance(rule, dict) else []:
            if concept not in CONCEPTS:
                errors.append(f"policy.supervisor.rules[{index}].intent: unknown intent {concept!r}; expected one of "
                              f"{list(CONCEPTS)}")
    return errors


def supervisor_of(run: Run) -> SupervisorPolicy | None:
    return policy_for(run).policy.supervisor


def choose_route(run: Run, policy: SupervisorPolicy, text: str) -> tuple[Route, dict[str, Any], dict[str, Any] | None]:
    """The route, the routing call's usage (empty for rules) and its ``model.call`` event payload (None for rules)."""
    if policy.mode == "rules":
        return route_by_rules(policy, text, intent=mentions), {}, None
    from agents.model_clients import model_client_for

    system = "\n\n".join(p for p in (run.version.system_prompt, ROUTING_PROMPT) if p)
    request = ModelRequest(model=run.version.model, messages=[{"role": "system", "content": system},
                                                              {"role": "user", "content": text}],
                           tools=route_choices(policy), metadata={"run_id": str(run.pk), "step": 1, "task": "route"},
                           max_output_tokens=256)
    started = time.monotonic()
    try:
        response = model_client_for(run).complete(request)
    except ModelError as exc:
        return fallback_route(policy, f"the model call failed ({type(exc).__name__})"), {}, None
    usage = response.usage
    call = {"model": response.model, "task": "route", "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens, "cost": usage.cost,
            "latency_ms": round((time.monotonic() - started) * 1000, 1), "finish_reason": response.finish_reason,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls],
            "content": response.content, "messages_in": len(request.messages), "trace": response.trace}
    return route_from_response(policy, response), usage.to_dict(), call


def _append(run: Run, events: list[Event], **changes: Any) -> None:
    """Commit ``events`` to the run's trace (and ``changes`` to its row) in one transaction, then publish them."""
    with transaction.atomic():
        # the run's row only (audit/chain.py's lock order): its tenant is read, not locked
        locked = Run.objects.select_for_update(of=("self",)).select_related("tenant").get(pk=run.pk)
        rows = event_rows(locked, locked.last_seq + 1, locked.step, events)
        RunEvent.objects.bulk_create(rows)
        changes["last_seq"] = locked.last_seq + len(rows)
        Run.objects.filter(pk=run.pk).update(**changes)
        for name, value in changes.items():
            setattr(locked, name, value)
            setattr(run, name, value)
        publish_after_commit(locked, rows, run_summary(locked))


def supervise(run: Run, policy: SupervisorPolicy) -> None:
    """Route the run's request, run the sub-agent as a child run, and finish the parent with its answer."""
    if run.last_seq > 0:  # a worker died after routing: finish from what it committed, never route twice
        _resume(run)
        return
    raw = tuple(policy_for(run).policy.input_masking.raw)
    text = mask_text(run.input, keep=raw)
    depth = int((run.facts or {}).get("agent_depth", 0)) + 1
    route, usage, call = choose_route(run, policy, text)
    root = Event("run.started", {"model": run.version.model, "supervisor": policy.mode, "sub_agents": policy.slugs()})
    routed = Event("supervisor.route", route.payload(policy.mode), parent_span_id=root.span_id)
    calls = [Event("model.call", call, parent_span_id=root.span_id)] if call is not None else []
    agent = None
    if route.agent is not None:
        agent = Agent.objects.for_tenant(run.tenant_id).filter(slug=route.agent, kind=AgentKind.AGENT).first()
    refusal = None
    if route.agent is None:
        refusal = f"no sub-agent for this request: {route.detail.get('why', '')}"
    elif agent is None:
        refusal = f"the sub-agent {route.agent!r} no longer exists in this tenant"
    elif depth > MAX_AGENT_DEPTH:
        refusal = f"the sub-agent {route.agent!r} would run {depth} agents deep; at most {MAX_AGENT_DEPTH} are allowed"
    _append(run, [root, *calls, routed], step=1, phase="acting", usage=usage or run.usage)
    if refusal is not None or agent is None:
        _finish(run, TerminalReason.ERROR, None, refusal or "no sub-agent", root.span_id)
        return
    try:
        child = run_as_child(run, agent, run.input, depth)
    except services.RunRefused as exc:
        _finish(run, TerminalReason.ERROR, None, f"the sub-agent {agent.slug!r} refused the request: {exc}", root.span_id)
        return
    _conclude(run, agent.slug, child, root.span_id)


def _resume(run: Run) -> None:
    """Finish a supervisor run its worker left after routing: the child it started (resumed or awaited), or the
    sub-agent the committed route names when the worker died before the child was created."""
    committed = {e.type: e for e in RunEvent.objects.filter(run_id=run.pk, type__in=["run.started", "supervisor.route"])}
    root_span = committed["run.started"].span_id if "run.started" in committed else ""
    routed = committed.get("supervisor.route")
    slug = (routed.payload or {}).get("agent") if routed is not None else None
    child = Run.objects.filter(tenant_id=run.tenant_id, facts__parent_run=str(run.pk)).order_by("created_at").first()
    if child is not None:
        wait = float(policy_for(run).policy.budgets.run.wall_seconds or 300)
        _conclude(run, child.agent.slug, resume_child(child, wait_seconds=wait), root_span)
        return
    agent = Agent.objects.for_tenant(run.tenant_id).filter(slug=slug, kind=AgentKind.AGENT).first() if slug else None
    if agent is None:
        _finish(run, TerminalReason.ERROR, None, f"the worker stopped after routing to {slug!r}, which cannot run now",
                root_span)
        return
    depth = int((run.facts or {}).get("agent_depth", 0)) + 1
    try:
        child = run_as_child(run, agent, run.input, depth)
    except services.RunRefused as exc:
        _finish(run, TerminalReason.ERROR, None, f"the sub-agent {agent.slug!r} refused the request: {exc}", root_span)
        return
    _conclude(run, agent.slug, child, root_span)


def _conclude(run: Run, slug: str, child: Run, root_span: str) -> None:
    """Finish the parent with the child's answer, or with an error naming the child run."""
    done = Event("supervisor.child_finished", {"agent": slug, "child_run": str(child.pk), "status": child.status,
                                               "terminal_reason": child.terminal_reason or None},
                 parent_span_id=root_span or None)
    if child.status == RunStatus.WAITING:  # the sub-agent waits for a human: so does the supervisor, worker freed
        waiting = Event("supervisor.waiting", {"agent": slug, "child_run": str(child.pk),
                                               "reason": "the sub-agent waits for an approval"},
                        parent_span_id=root_span or None)
        _append(run, [waiting], status=RunStatus.WAITING, phase="waiting",
                facts={**(run.facts or {}), AWAITING_CHILD: str(child.pk)})
        return
    if child.status == RunStatus.FINISHED and child.terminal_reason == TerminalReason.FINAL_ANSWER.value:
        _finish(run, TerminalReason.FINAL_ANSWER, child.output, "final_answer", root_span, first=done,
                child_run=str(child.pk))
    else:
        why = (f"the sub-agent {slug!r} did not answer (child run {child.pk}: {child.status} "
               f"{child.terminal_reason or ''} {child.error or ''})").strip()
        _finish(run, TerminalReason.ERROR, None, why, root_span, first=done, child_run=str(child.pk))


def _finish(run: Run, reason: TerminalReason, output: str | None, why: str, root_span: str, *,
            first: Event | None = None, child_run: str | None = None) -> None:
    events = [first] if first is not None else []
    events.append(Event("run.finished", {"terminal_reason": reason.value, "output": output, "reason": why,
                                         "decided_by": "supervisor", "child_run": child_run},
                        parent_span_id=root_span or None))
    changes: dict[str, Any] = {"status": RunStatus.FINISHED, "terminal_reason": reason.value, "phase": "finished",
                               "output": mask_text(output or ""), "finished_at": timezone.now()}
    if reason != TerminalReason.FINAL_ANSWER:
        changes["error"] = why
    _append(run, events, **changes)

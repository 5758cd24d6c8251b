"""Release safety pages (issue #16): evaluation sets (list, create by filter or picked runs), a set's page with the
replay form, and a replay batch's page (live progress by polling its JSON, then the per-run diffs, regressions first).

Thin like the other pages: the actor from the session, every read through the tenancy gate (``for_actor``: a foreign
tenant's set or batch is a 404, the same as an unknown one), every change through ``releases.services`` (the same
validation and audit rows as the API and the admin). Forms are POSTs with Django's CSRF token.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agents.models import Agent, AgentVersion, Run
from core.errors import DomainError
from core.numbers import number_or_text, whole_number
from releases import diffs, services
from releases.models import EvaluationSet, MissPolicy, ModelMode, ReplayBatch
from tenants.scoping import Actor, actor_for_user

SETS_SHOWN = 200
MEMBERS_SHOWN = 500
PICK_MAX = services.MAX_SET_RUNS


def _actor(request: HttpRequest) -> Actor:
    return actor_for_user(request.user)


def _agents(actor: Actor) -> list[Agent]:
    """Agents and flows of tenants where the actor may create sets."""
    ids = actor.tenant_ids("operate")
    agents = Agent.objects.for_actor(actor).select_related("tenant").order_by("tenant__slug", "slug")
    return [a for a in agents if ids is None or a.tenant_id in ids]


def _visible_set(actor: Actor, set_id: Any) -> EvaluationSet:
    row = EvaluationSet.objects.for_actor(actor, "view").select_related("agent", "tenant").filter(pk=set_id).first()
    if row is None:
        raise Http404("No such evaluation set here.")  # unknown and foreign sets look the same
    return row


def _visible_batch(actor: Actor, batch_id: Any) -> ReplayBatch:
    row = (ReplayBatch.objects.for_actor(actor, "view").select_related("evaluation_set", "candidate__agent", "tenant")
           .filter(pk=batch_id).first())
    if row is None:
        raise Http404("No such replay here.")
    return row


def _split(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


def _filters_from(post: Any) -> dict[str, Any]:
    filters: dict[str, Any] = {}
    versions = _split(post.get("versions", ""))
    if versions:
        filters["versions"] = [number_or_text(v.lower().removeprefix("v")) for v in versions]
    for key in ("created_after", "created_before", "terminal_reason"):
        value = (post.get(key) or "").strip()
        if value:
            filters[key] = value
    limit = (post.get("limit") or "").strip()
    if limit:
        filters["limit"] = number_or_text(limit)
    return filters



@login_required
@require_http_methods(["GET", "POST"])
def evaluation_sets(request: HttpRequest) -> HttpResponse:
    """The sets the actor can see, and the form that creates one (by filter, or from runs picked on the runs list)."""
    actor = _actor(request)
    agents = _agents(actor)
    form: dict[str, Any] = {"runs": "\n".join(request.GET.getlist("run")), "agent": request.GET.get("agent", "")}
    error, field, status = "", "", 200
    if request.method == "POST":
        form = {key: request.POST.get(key, "") for key in ("name", "description", "agent", "versions", "created_after",
                                                            "created_before", "terminal_reason", "limit", "runs")}
        agent = next((a for a in agents if str(a.pk) == form["agent"]), None)
        picked = _split(form["runs"])
        try:
            if agent is None:
                raise DomainError("agent: choose one of your agents.", field="agent")
            if len(picked) > PICK_MAX:
                raise DomainError(f"run_ids: at most {PICK_MAX} runs may be picked.", field="run_ids")
            row = services.create_evaluation_set(
                tenant=agent.tenant, actor=actor, name=form["name"], agent=agent, description=form["description"],
                filters=None if picked else _filters_from(request.POST), run_ids=picked or None)
        except DomainError as exc:
            error, field, status = exc.message, exc.field or "", exc.status
        else:
            messages.success(request, f"Evaluation set {row.name!r} created with {row.members.count()} runs (frozen).")
            return redirect("console:evaluation-set", set_id=row.pk)
    sets = list(EvaluationSet.objects.for_actor(actor, "view").select_related("agent", "tenant")
                .annotate(member_count=Count("members")).order_by("-created_at")[:SETS_SHOWN])
    return render(request, "console/evaluation_sets.html", {
        "nav": "releases", "sets": sets, "agents": agents, "form": form,
        "error": error, "error_field": field, "reasons": sorted(set(Run.objects.for_actor(actor, "view")
                                                                    .exclude(terminal_reason="")
                                                                    .values_list("terminal_reason", flat=True)[:1000])),
    }, status=status)


@login_required
@require_GET
def evaluation_set(request: HttpRequest, set_id: Any) -> HttpResponse:
    actor = _actor(request)
    row = _visible_set(actor, set_id)
    members = list(row.members.select_related("run__version").order_by("position")[:MEMBERS_SHOWN])
    return render(request, "console/evaluation_set.html", {
        "nav": "releases", "set": row, "members": members, "total": row.members.count(),
        "versions": list(AgentVersion.objects.filter(agent=row.agent).order_by("-number")),
        "batches": list(row.batches.select_related("candidate").order_by("-created_at")[:50]),
        "can_operate": actor.can("operate", row.tenant_id), "modes": ModelMode.values, "miss_policies": MissPolicy.values,
        "checks": list(diffs.CHECKS), "form": {"version": row.agent.current_version_id, "model_mode": ModelMode.RECORDED,
                                              "miss_policy": MissPolicy.STOP, "checks": ["same_tools", "same_terminal_reason"]},
    })


def _checks_from(post: Any) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = [{"check": name} for name in post.getlist("check")
                                    if diffs.CHECKS.get(name, "x") is None]
    for name, param in (("answer_contains", "text"), ("answer_not_contains", "text")):
        value = (post.get(name) or "").strip()
        if value:
            checks.append({"check": name, param: value})
    for name in ("cost_at_most", "steps_at_most"):
        value = (post.get(name) or "").strip()
        if value:
            try:
                checks.append({"check": name, "times": float(value)})
            except ValueError:
                checks.append({"check": name, "times": value})  # the service names it
    return checks


@login_required
@require_POST
def start_replay(request: HttpRequest, set_id: Any) -> HttpResponse:
    actor = _actor(request)
    row = _visible_set(actor, set_id)
    version = AgentVersion.objects.filter(agent=row.agent, pk=whole_number(request.POST.get("candidate") or "") or 0).first()
    try:
        if version is None:
            raise DomainError("candidate: choose a version of the set's agent.", field="candidate")
        concurrency = (request.POST.get("concurrency") or "").strip()
        batch = services.start_replay(
            tenant=row.tenant, actor=actor, evaluation_set=row, candidate=version,
            model_mode=request.POST.get("model_mode") or ModelMode.RECORDED,
            miss_policy=request.POST.get("miss_policy") or MissPolicy.STOP, checks=_checks_from(request.POST) or None,
            cost_cap=(request.POST.get("cost_cap") or "").strip() or None,
            concurrency=number_or_text(concurrency) if concurrency else None)
    except DomainError as exc:
        messages.error(request, f"Replay not started: {exc.message}")
        return redirect("console:evaluation-set", set_id=row.pk)
    return redirect("console:replay-batch", batch_id=batch.pk)


def _side(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(_call(v) for v in value) or "(none)"
    return "" if value is None else str(value)


def _call(value: Any) -> str:
    if isinstance(value, dict):
        return f"{value.get('tool', value.get('name', '?'))}({value.get('arguments', '')})"
    return str(value)


ROWS = (("tools", "Tool calls"), ("approvals", "Approvals needed"), ("terminal_reason", "Terminal reason"),
        ("answer", "Answer"), ("steps", "Steps"), ("tokens", "Tokens"), ("cost", "Cost"))


def _result_view(result: dict[str, Any]) -> dict[str, Any]:
    diff = result.get("diff") or {}
    rows = []
    for key, label in ROWS:
        pair = diff.get(key) or {}
        rows.append({"key": key, "label": label, "recorded": _side(pair.get("recorded")), "replayed": _side(pair.get("replayed")),
                     "same": pair.get("same", True)})
    latency = diff.get("latency_ms") or {}
    rows.append({"key": "latency_ms", "label": "Latency (ms)", "recorded": _side(latency.get("recorded")),
                 "replayed": _side(latency.get("replayed")), "same": True})
    return {**result, "rows": rows, "answer_diff": "\n".join((diff.get("answer") or {}).get("diff") or []),
            "new_approvals": (diff.get("approvals") or {}).get("new") or [], "misses": diff.get("misses") or []}


@login_required
@require_GET
def replay_batch(request: HttpRequest, batch_id: Any) -> HttpResponse:
    actor = _actor(request)
    batch = _visible_batch(actor, batch_id)
    report = services.batch_report(batch)
    return render(request, "console/replay_batch.html", {
        "nav": "releases", "batch": batch, "report": report, "results": [_result_view(r) for r in report["results"]],
        "running": batch.status in ("queued", "running"),
        "can_cancel": batch.status in ("queued", "running") and actor.can("operate", batch.tenant_id),
    })


@login_required
@require_POST
def cancel_replay(request: HttpRequest, batch_id: Any) -> HttpResponse:
    """Stop a queued or running replay (its shards stop before their next chunk; results so far are kept)."""
    actor = _actor(request)
    batch = _visible_batch(actor, batch_id)
    try:
        services.cancel_replay(tenant=batch.tenant, actor=actor, batch=batch)
    except DomainError as exc:
        messages.error(request, f"Not cancelled: {exc.message}")
    else:
        messages.success(request, "Replay cancelled; the results so far are kept.")
    return redirect("console:replay-batch", batch_id=batch.pk)


@login_required
@require_GET
def replay_batch_progress(request: HttpRequest, batch_id: Any) -> JsonResponse:
    """What the batch page polls while the replay runs (the batch row: one query)."""
    batch = _visible_batch(_actor(request), batch_id)
    return JsonResponse({"id": batch.pk, "status": batch.status, "done": batch.done, "total": batch.total,
                         "passed": batch.passed_count, "failed": batch.failed_count, "pass_rate": batch.pass_rate,
                         "cost_spent": str(batch.cost_spent)})

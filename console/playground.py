"""The playground: an operator picks an agent and any of its versions, sends a message, and watches the run.

The page (``GET /console/playground/``) lists the agents of the tenants where the user may ``operate`` (start runs)
and all their versions; a viewer or approver gets a 403 and no nav link. Starting a run is a session POST with CSRF
(``POST /console/playground/runs/``) that calls the API's acceptance path (``agents.acceptance.accept_run``) with the
chosen version and ``playground=True``; the page then reads the run's SSE stream (``/api/v1/runs/<id>/stream``,
session auth) for its committed steps and ``message.delta`` frames (static/console/playground.js).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from agents import acceptance, services
from agents.models import Agent, AgentKind, AgentVersion
from core.numbers import whole_number
from tenants.scoping import Actor, actor_for_user

INPUT_MAX_CHARS = 20_000


def can_play(actor: Actor) -> bool:
    """May this actor use the playground: a role that starts runs (``operate``) in at least one tenant."""
    ids = actor.tenant_ids("operate")
    return ids is None or bool(ids)


def _agents(actor: Actor) -> list[dict[str, Any]]:
    agents = list(
        Agent.objects.for_actor(actor, "operate").filter(kind=AgentKind.AGENT)
        .select_related("tenant").order_by("tenant__slug", "slug")
    )
    versions: dict[int, list[dict[str, Any]]] = {}
    rows = (AgentVersion.objects.for_actor(actor, "operate").filter(agent__in=agents)
            .order_by("agent_id", "-number").values("id", "agent_id", "number", "model", "note"))
    for row in rows:
        versions.setdefault(row["agent_id"], []).append(row)
    return [{
        "id": agent.pk, "label": f"{agent.tenant.slug}/{agent.slug}",
        "current": agent.current_version_id,
        "versions": [{"id": v["id"], "label": f"v{v['number']} · {v['model']}"
                      + (" (current)" if v["id"] == agent.current_version_id else "")
                      + (f" — {v['note'][:60]}" if v["note"] else "")} for v in versions.get(agent.pk, [])],
    } for agent in agents]


def _player(request: HttpRequest) -> Actor:
    actor = actor_for_user(request.user)
    if not can_play(actor):
        raise PermissionDenied("The playground starts runs: you need the role owner or operator in a tenant.")
    return actor


@login_required
@require_GET
def page(request: HttpRequest) -> HttpResponse:
    actor = _player(request)
    return render(request, "console/playground.html", {
        "nav": "playground", "agents": _agents(actor), "input_max": INPUT_MAX_CHARS,
    })


def _refused(message: str, field: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": message, "field": field}, status=status)


@login_required
@require_POST
def start(request: HttpRequest) -> JsonResponse:
    """Start a playground run: form fields ``agent`` (id), ``version`` (id, one of that agent's) and ``input``."""
    actor = _player(request)
    agent_id, version_id = request.POST.get("agent", ""), request.POST.get("version", "")
    text = request.POST.get("input", "").strip()
    agent_pk, version_pk = whole_number(agent_id), whole_number(version_id)
    if agent_pk is None:
        return _refused("Pick an agent (its id).", "agent")
    if version_pk is None:
        return _refused("Pick a version of the agent (its id).", "version")
    if not text:
        return _refused("Type a message for the agent.", "input")
    if len(text) > INPUT_MAX_CHARS:
        return _refused(f"The message has {len(text)} characters; at most {INPUT_MAX_CHARS} are accepted.", "input")
    # Unknown, foreign-tenant and flow agents look the same: not found. So does a version of another agent.
    agent = (Agent.objects.for_actor(actor, "operate").filter(kind=AgentKind.AGENT, pk=agent_pk)
             .select_related("tenant").first())
    if agent is None:
        raise Http404("No such agent here.")
    version = AgentVersion.objects.for_actor(actor, "operate").filter(agent=agent, pk=version_pk).first()
    if version is None:
        raise Http404(f"No such version of the agent {agent.slug!r}.")
    try:
        run = acceptance.accept_run(actor=actor, agent=agent, text=text, version=version, playground=True).run
    except services.RunRefused as exc:
        return _refused(str(exc), exc.field or "", 400 if exc.field else 409)
    return JsonResponse({
        "id": str(run.pk), "version": version.number, "stream": f"/api/v1/runs/{run.pk}/stream",
        "trace": f"/console/runs/{run.pk}/",
    }, status=201)


def context(request: HttpRequest) -> dict[str, Any]:
    """Template context for every page: ``can_play`` (the nav's Playground link), computed only when used."""
    return {"can_play": lambda: can_play(actor_for_user(getattr(request, "user", None)))}

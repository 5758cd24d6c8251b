"""The console's pages. Thin: resolve the actor, read through the tenancy gate, render.

Every page carries the site's Content-Security-Policy (django-csp, ``settings.CONTENT_SECURITY_POLICY``):
scripts and styles come from our static files only, so model output can never run as script even if a
template slipped.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from agents import attention
from agents.models import RunEvent, Session
from agents.serializers import event_frames
from audit.models import ToolCallAudit
from console import queries
from console.flow_view import flow_context
from core.numbers import whole_number
from tenants.scoping import Actor, actor_for_user

TRACE_BACKLOG = 1000
TOOL_CALLS_MAX = 2000


def _actor(request: HttpRequest) -> Actor:
    return actor_for_user(request.user)


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return redirect("console:runs")


@login_required
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    actor = _actor(request)
    filters = queries.RunFilters.from_query(request.GET)
    runs = filters.apply(queries.runs_for(actor)).order_by("-created_at", "-pk")
    page = Paginator(runs, queries.RUN_LIST_PAGE).get_page(request.GET.get("page"))
    now = timezone.now()
    choices = queries.filter_choices(actor)
    return render(request, "console/runs.html", {
        "nav": "runs",
        "page": page,
        "rows": [queries.run_row(run, now=now) for run in page.object_list],
        "filters": filters,
        "choices": choices,
        "version_label": queries.version_label(actor, filters.version),
        "show_tenant": actor.is_superuser or len(actor.roles) > 1,
        # Live updates only where a new run belongs: the first page, unfiltered or filtered in the browser.
        "live": page.number == 1,
        "prev_query": filters.query(page=page.previous_page_number()) if page.has_previous() else "",
        "next_query": filters.query(page=page.next_page_number()) if page.has_next() else "",
        # the runs on this page, picked for a new evaluation set (console/release_pages.py)
        "set_query": urlencode([("agent", filters.agent or ""), *[("run", str(run.pk)) for run in page.object_list]]),
    })


def _visible_run(actor: Actor, run_id: Any) -> Any:
    run = queries.runs_for(actor).filter(pk=run_id).first()
    if run is None:
        raise Http404("No such run here.")  # unknown and foreign runs look the same
    return run


def _tool_calls(actor: Actor, run: Any) -> dict[str, dict[str, Any]]:
    """Masked argument summaries of the run's tool calls, from their audit rows, keyed by span id.

    None for a run of an erased session: its audit rows are kept (append-only), but the trace shows nothing of them.
    """
    if Session.objects.filter(pk=run.session_id, erased_at__isnull=False).exists():
        return {}
    rows = (
        ToolCallAudit.objects.for_actor(actor).filter(run_id=run.pk)
        .order_by("id").values("span_id", "call_id", "tool_name", "arguments_summary", "status", "latency_ms")[:TOOL_CALLS_MAX]
    )
    return {row["span_id"] or row["call_id"]: row for row in rows}


@login_required
@require_GET
def run_trace(request: HttpRequest, run_id: Any) -> HttpResponse:
    actor = _actor(request)
    run = _visible_run(actor, run_id)
    events = event_frames(RunEvent.objects.filter(run_id=run.pk).order_by("seq")[:TRACE_BACKLOG])
    return render(request, "console/run_trace.html", {
        "nav": "runs",
        "run": run,
        "row": queries.run_row(run),
        "attention_reasons": attention.open_reasons(run) if run.needs_attention else [],
        "can_resolve": run.needs_attention and actor.can(attention.RESOLVE_ACTION, run.tenant_id),
        "note_max": attention.NOTE_MAX_CHARS,
        "events": events,
        "tool_calls": _tool_calls(actor, run),
        "last_seq": events[-1]["seq"] if events else 0,
        "ws_path": f"/ws/runs/{run.pk}/",
        "flow": flow_context(run),
    })


@login_required
@require_POST
def resolve_attention(request: HttpRequest, run_id: Any) -> HttpResponse:
    """The run page's form: an operator says what they checked (agents/attention.py, as the API and the admin)."""
    actor = _actor(request)
    run = _visible_run(actor, run_id)
    try:  # a viewer's PermissionDenied is Django's 403
        attention.resolve_attention(actor=actor, run=run, note=request.POST.get("note", ""), via="console")
    except attention.AttentionRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Resolved: the run no longer needs attention (recorded in the audit).")
    return redirect("console:run", run_id=run.pk)


@login_required
@require_GET
def run_tool_calls(request: HttpRequest, run_id: Any) -> JsonResponse:
    """The masked arguments of a run's tool calls, for the live trace (trace events carry no arguments)."""
    actor = _actor(request)
    run = _visible_run(actor, run_id)
    return JsonResponse({"tool_calls": _tool_calls(actor, run)})


@login_required
@require_GET
def spend(request: HttpRequest) -> HttpResponse:
    raw = request.GET.get("days", "30")
    days = whole_number(raw, digits=4) or 30
    days = min(max(days, 1), queries.SPEND_MAX_DAYS)
    report = queries.spend_for(_actor(request), days=days)
    return render(request, "console/spend.html", {
        "nav": "spend", "spend": report, "since": f"{report.since:%Y-%m-%d}", "day_choices": [1, 7, 30, 90, 365],
    })


login = auth_views.LoginView.as_view(redirect_authenticated_user=True)
logout = auth_views.LogoutView.as_view(next_page="/accounts/login/")

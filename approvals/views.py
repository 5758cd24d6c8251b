"""The approver's pages: ``/approvals/`` (the live inbox) and ``/approvals/<id>/`` (preview and decision)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from approvals import decisions, reveal
from approvals.models import ApprovalRequest, ApprovalStatus
from config.errors import Forbidden, Invalid, NotFound
from tenants.scoping import actor_for_user


def _visible(request: HttpRequest) -> Any:
    return (
        ApprovalRequest.objects.for_actor(actor_for_user(request.user), "review")
        .select_related("run", "run__agent", "tenant")
        .prefetch_related("decisions__user")
    )


def _rows(request: HttpRequest) -> list[dict[str, Any]]:
    now = timezone.now()
    actor = actor_for_user(request.user)
    rows = []
    for item in _visible(request).filter(status=ApprovalStatus.PENDING).order_by("requested_at")[:200]:
        rows.append(
            {
                "request": item,
                "waiting_seconds": int((now - item.requested_at).total_seconds()),
                "seconds_left": max(0, int((item.expires_at - now).total_seconds())),
                "may_decide": decisions.may_decide(actor, item),
                "may_view_trace": actor.can("view", item.tenant_id),
                "approvals_so_far": sum(1 for d in item.decisions.all() if d.approved),
            }
        )
    return rows


@login_required
def inbox(request: HttpRequest) -> HttpResponse:
    rows = _rows(request)
    context = {"rows": rows, "oldest": rows[0] if rows else None, "newest": rows[-1] if rows else None, "nav": "approvals"}
    template = "approvals/_list.html" if request.GET.get("fragment") == "1" else "approvals/inbox.html"
    return render(request, template, context)


def _detail(request: HttpRequest, item: ApprovalRequest, revealed: dict[str, str] | None = None, status: int = 200) -> HttpResponse:
    now = timezone.now()
    actor = actor_for_user(request.user)
    may_reveal = reveal.may_reveal(actor, item)
    revealable = set(reveal.revealable_fields(item))
    shown = revealed or {}
    arguments = [
        {"key": key, "value": value, "revealed": shown.get(key), "revealable": may_reveal and key in revealable}
        for key, value in (item.preview.get("arguments") or {}).items()
    ] if isinstance(item.preview, dict) and isinstance(item.preview.get("arguments"), dict) else []
    context = {
        "item": item,
        "nav": "approvals",
        "may_decide": decisions.may_decide(actor, item),
        "may_view_trace": actor.can("view", item.tenant_id),
        "seconds_left": max(0, int((item.expires_at - now).total_seconds())),
        "decisions": list(item.decisions.all()),
        "arguments": arguments,
    }
    response = render(request, "approvals/detail.html", context, status=status)
    if revealed:
        response["Cache-Control"] = "no-store"  # an unmasked value stays out of caches and the back/forward cache
    return response


@login_required
def detail(request: HttpRequest, pk: Any) -> HttpResponse:
    item = _visible(request).filter(pk=pk).first()
    if item is None:
        raise Http404("No such approval request.")
    return _detail(request, item)


@login_required
@require_POST
def reveal_field(request: HttpRequest, pk: Any) -> HttpResponse:
    """Show one masked argument unmasked (audited). The value is in this response only, never logged or published."""
    item = _visible(request).select_related("tool").filter(pk=pk).first()
    if item is None:
        raise Http404("No such approval request.")
    field = request.POST.get("field", "")
    try:
        value = reveal.reveal(actor=actor_for_user(request.user), request_id=pk, field=field)
    except NotFound:
        raise Http404("No such approval request.") from None
    except (Forbidden, Invalid) as exc:
        messages.error(request, str(exc))
        return _detail(request, item, status=exc.status)
    return _detail(request, item, revealed={field: value})


@login_required
@require_POST
def decide(request: HttpRequest, pk: Any) -> HttpResponse:
    if not _visible(request).filter(pk=pk).exists():
        raise Http404("No such approval request.")
    approve = request.POST.get("decision") == "approve"
    note = request.POST.get("note", "").strip()
    try:
        decisions.decide(actor=actor_for_user(request.user), request_id=pk, approve=approve, note=note, via="page")
    except decisions.ApprovalRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Approved." if approve else "Rejected.")
    # Only back to a page of this site: a crafted form must not turn the decision into an open redirect.
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return redirect("approvals:inbox")
    return redirect(target)

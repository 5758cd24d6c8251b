"""The approver's pages: ``/approvals/`` (the live inbox) and ``/approvals/<id>/`` (preview and decision)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from approvals import decisions, edits, reveal
from approvals.models import ApprovalRequest, ApprovalStatus
from audit.masking import mask_value
from core.errors import Forbidden, Invalid, NotFound
from core.parsers import loads_bounded
from tenants.scoping import actor_for_user


def _visible(request: HttpRequest) -> Any:
    return (
        ApprovalRequest.objects.for_actor(actor_for_user(request.user), "review")
        .select_related("run", "run__agent", "run__version", "tenant", "tool")
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


def _edit_fields(item: ApprovalRequest, submitted: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One input per argument for "approve with edits": prefilled unless the value is masked (then empty keeps it)."""
    sensitive = (item.tool.sensitive_fields if item.tool is not None else None) or ()
    current = item.current_arguments or {}
    masked = mask_value(current, sensitive)
    props = ((item.tool.parameters or {}).get("properties") or {}) if item.tool is not None else {}
    names = list(dict.fromkeys([*current, *props]))
    rows = []
    for key in names:
        value = current.get(key)
        hidden = key in current and masked.get(key) != value
        shown = "" if hidden or value is None else value if isinstance(value, str) else json.dumps(value)
        rows.append({"key": key, "value": (submitted or {}).get(key, shown), "masked": hidden})
    return rows


def _edited_rows(item: ApprovalRequest) -> list[dict[str, Any]]:
    """Original next to edited, field by field (masked), for a request an approver edited."""
    changed = {c["field"]: c for c in (item.preview or {}).get("changes") or []}
    original = (item.preview or {}).get("arguments") or {}
    edited = (item.preview or {}).get("edited_arguments") or {}
    return [
        {"key": key, "old": original.get(key), "new": edited.get(key), "changed": key in changed}
        for key in dict.fromkeys([*original, *edited])
    ]


def _detail(request: HttpRequest, item: ApprovalRequest, revealed: dict[str, str] | None = None, status: int = 200,
            edit_error: list[str] | None = None, submitted: dict[str, str] | None = None) -> HttpResponse:
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
        "edited_rows": _edited_rows(item) if item.edited_arguments is not None else [],
        "may_edit": item.status == ApprovalStatus.PENDING and item.edited_arguments is None
        and not any(d.approved for d in item.decisions.all()) and edits.edits_allowed(item),
        "edit_fields": _edit_fields(item, submitted),
        "edit_error": edit_error or [],
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


def _submitted_edits(request: HttpRequest, item: ApprovalRequest) -> tuple[dict[str, str], dict[str, Any]]:
    """The edit form's inputs (``arg:<field>``) and the changes they make: an empty input keeps the value; a field
    whose schema is not a string is read as JSON when it parses (``5`` a number, ``true``), else as typed."""
    props = ((item.tool.parameters or {}).get("properties") or {}) if item.tool is not None else {}
    submitted = {k[4:]: v for k, v in request.POST.items() if k.startswith("arg:")}
    changes: dict[str, Any] = {}
    for key, text in submitted.items():
        if text.strip() == "":
            continue
        value: Any = text
        if (props.get(key) or {}).get("type") != "string":
            try:
                value = loads_bounded(text)
            except ValueError:  # malformed, or past the bounds: taken as typed, and the tool's schema judges it
                value = text
        if item.current_arguments.get(key) != value:
            changes[key] = value
    return submitted, changes


@login_required
@require_POST
def decide(request: HttpRequest, pk: Any) -> HttpResponse:
    item = _visible(request).select_related("tool", "run__version").filter(pk=pk).first()
    if item is None:
        raise Http404("No such approval request.")
    approve = request.POST.get("decision") == "approve"
    note = request.POST.get("note", "").strip()
    submitted, changes = _submitted_edits(request, item) if request.POST.get("edit") == "1" else ({}, None)
    try:
        decisions.decide(actor=actor_for_user(request.user), request_id=pk, approve=approve, note=note, via="page",
                         arguments=changes or None, seen_hash=request.POST.get("arguments_hash", ""))
    except edits.EditInvalid as exc:
        return _detail(request, item, status=400, edit_error=exc.problems, submitted=submitted)
    except decisions.ApprovalRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, ("Approved with your edits." if changes else "Approved.") if approve else "Rejected.")
    # Only back to a page of this site: a crafted form must not turn the decision into an open redirect.
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return redirect("approvals:inbox")
    return redirect(target)

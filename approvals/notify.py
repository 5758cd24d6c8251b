"""Approval notifications: who is told of a request (fan-out), what they read (bodies), and one delivery attempt.

A request that arrives, or expires within ``APPROVAL_EXPIRY_NOTICE_SECONDS``, gets one :class:`Delivery` row per
matching channel of its tenant; the workers send each (``approvals.tasks.deliver_task``) and retry a failure with
exponential backoff. Every body deep-links to the request's approval page and carries its arguments masked
(``audit.masking``). Webhooks go through the egress guard and are signed: ``X-AgentOps-Signature: v1=<hex>``,
the HMAC-SHA256 of ``"<X-AgentOps-Timestamp>.<body>"`` with the channel's secret (:func:`sign`); a receiver
refuses a timestamp older than a few minutes (replay).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import time
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from approvals.channels import WEBHOOKS, secret_for
from approvals.models import (
    ApprovalRequest,
    ApprovalStatus,
    ChannelKind,
    Delivery,
    DeliveryStatus,
    NotificationChannel,
    NotifyEvent,
)
from audit.masking import mask_value
from egress.guard import EgressDenied, guarded_client
from runtime.approval_policy import DEFAULT_APPROVER_ROLES
from tenants.models import Membership

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-AgentOps-Signature"
TIMESTAMP_HEADER = "X-AgentOps-Timestamp"
MAX_BACKOFF = 3600.0


def approval_url(request_id: Any) -> str:
    return settings.PUBLIC_BASE_URL + reverse("approvals:detail", args=[request_id])


def sign(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"v1={digest}"


def backoff(attempts: int) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: base, 2x base, 4x base..., at most an hour."""
    return float(min(MAX_BACKOFF, settings.NOTIFY_RETRY_BASE_SECONDS * 2 ** max(0, attempts - 1)))


# -- what is said ------------------------------------------------------------------------------


def facts(request: ApprovalRequest, event: str) -> dict[str, Any]:
    """The request as every body tells it; argument values the tool marks sensitive (and secrets) masked."""
    sensitive = (request.tool.sensitive_fields or []) if request.tool is not None else []
    left = max(0, int((request.expires_at - timezone.now()).total_seconds()))
    return {
        "event": f"approval.{event}",
        "id": str(request.pk),
        "tenant": request.tenant.slug,
        "tool": request.tool_name,
        "agent": request.run.agent.slug,
        "run": str(request.run_id),
        "status": request.status,
        "arguments": mask_value(request.arguments, sensitive),
        "required_approvals": request.required_approvals,
        "requested_at": request.requested_at.isoformat(),
        "expires_at": request.expires_at.isoformat(),
        "expires_in_seconds": left,
        "url": approval_url(request.pk),
    }


def _when(seconds: int) -> str:
    return f"{seconds // 60} min" if seconds >= 120 else f"{seconds} s"


def headline(data: dict[str, Any]) -> str:
    verb = "needs approval" if data["event"] == "approval.arrived" else "expires soon and still needs approval"
    return f"{data['tool']} for {data['agent']} {verb} (expires in {_when(data['expires_in_seconds'])})"


def json_body(data: dict[str, Any]) -> dict[str, Any]:
    return {"event": data["event"], "approval": {k: v for k, v in data.items() if k != "event"}, "url": data["url"]}


#: What Slack reads as markup in a message's text: ``&``, ``<`` and ``>`` (mentions such as ``<!channel>``, links such
#: as ``<https://x|label>``) are escaped as its formatting rules say; a backtick, which Slack cannot escape, becomes a
#: look-alike (U+02CB) so argument text can neither close the code block nor open one.
_SLACK_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "`": "\u02cb"}
_SLACK_TABLE = str.maketrans(_SLACK_ESCAPES)
#: Slack refuses a section whose text is longer than 3,000 characters; the arguments' block keeps to this many.
SLACK_CODE_CHARS = 2990


def slack_text(text: str) -> str:
    """``text`` as Slack shows it literally: no mention, link or code fence of its own."""
    return text.translate(_SLACK_TABLE)


def _slack_code(text: str, limit: int = SLACK_CODE_CHARS) -> str:
    """``text`` escaped, cut to ``limit`` characters between two escapes (never inside ``&amp;``), in a code block."""
    escaped = slack_text(text)
    if len(escaped) + 6 > limit:
        out, size = [], 6
        for ch in text:
            piece = _SLACK_ESCAPES.get(ch, ch)
            if size + len(piece) > limit:
                break
            out.append(piece)
            size += len(piece)
        escaped = "".join(out)
    return f"```{escaped}```"


def slack_body(data: dict[str, Any]) -> dict[str, Any]:
    """Slack's incoming-webhook body (``text`` for clients without blocks; a section, the arguments and a button).

    Everything a tenant or a model wrote (the arguments, the tool's and agent's names) is escaped (:func:`slack_text`)."""
    arguments = json.dumps(data["arguments"], ensure_ascii=False, indent=1)[:SLACK_CODE_CHARS]
    title = slack_text(headline(data))
    where = slack_text(f"Tenant {data['tenant']}, run {data['run']}")
    return {
        "text": f"{title}: {data['url']}",
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{title}*\n{where}"}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _slack_code(arguments)}},
            {"type": "actions", "elements": [
                {"type": "button", "text": {"type": "plain_text", "text": "Review the request"}, "url": data["url"]},
            ]},
        ],
    }


def email_text(data: dict[str, Any]) -> tuple[str, str]:
    arguments = json.dumps(data["arguments"], ensure_ascii=False, indent=2)
    body = (
        f"{headline(data)}.\n\nTenant: {data['tenant']}\nRun: {data['run']}\n"
        f"Approvals needed: {data['required_approvals']}\nExpires at: {data['expires_at']}\n\n"
        f"Arguments:\n{arguments}\n\nReview and decide: {data['url']}\n"
    )
    return f"[AgentOps] {headline(data)}", body


# -- who is told -------------------------------------------------------------------------------


def fan_out(request_id: Any, event: str) -> list[int]:
    """One Delivery per enabled channel of the request's tenant that takes ``event`` (and the tool); their ids.

    Idempotent: a second call for the same request and event adds no row and returns only the pending ones."""
    request = ApprovalRequest.objects.filter(pk=request_id, status=ApprovalStatus.PENDING).first()
    if request is None:
        return []
    channels = NotificationChannel.objects.filter(tenant_id=request.tenant_id, enabled=True).prefetch_related("tools")
    chosen = [c for c in channels if event in (c.events or [])
              and (not c.tools.all() or any(t.pk == request.tool_id for t in c.tools.all()))]
    if chosen:
        Delivery.objects.bulk_create(
            [Delivery(tenant_id=request.tenant_id, channel=c, request=request, event=event) for c in chosen],
            ignore_conflicts=True)
    if event == NotifyEvent.ARRIVED and not request.arrival_noticed:
        ApprovalRequest.objects.filter(pk=request.pk).update(arrival_noticed=True)
    if not chosen:
        return []
    return list(Delivery.objects.filter(request=request, event=event, channel__in=chosen, status=DeliveryStatus.PENDING)
                .values_list("pk", flat=True))


def unannounced_requests() -> list[Any]:
    """Pending requests whose arrival was never fanned out (the task that announces it was lost: a worker killed with it,
    a Redis emptied before a worker took it), older than ``NOTIFY_RESEND_AFTER_SECONDS``. Their deliveries are made by
    the approval-expiry sweep, as the lost task would have made them."""
    cutoff = timezone.now() - dt.timedelta(seconds=settings.NOTIFY_RESEND_AFTER_SECONDS)
    return list(ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, arrival_noticed=False, requested_at__lt=cutoff)
                .order_by("requested_at").values_list("pk", flat=True)[:500])


def expiry_notices_due() -> list[Any]:
    """Pending requests that expire within the lead time and were not announced as expiring yet: claimed in one
    UPDATE (a second sweep finds them claimed), returned for fan-out. Two queries, whatever their number."""
    lead = settings.APPROVAL_EXPIRY_NOTICE_SECONDS
    if not lead:
        return []
    now = timezone.now()
    with transaction.atomic():
        due = ApprovalRequest.objects.filter(
            status=ApprovalStatus.PENDING, expiry_noticed=False, expires_at__gt=now, expires_at__lte=now + dt.timedelta(seconds=lead)
        )
        ids = list(due.select_for_update(skip_locked=True).values_list("pk", flat=True)[:500])
        if ids:
            ApprovalRequest.objects.filter(pk__in=ids, expiry_noticed=False).update(expiry_noticed=True)
    return ids


def stranded_deliveries() -> list[int]:
    """Deliveries whose task was lost (a broker outage, a worker killed with it in memory): pending for over
    ``NOTIFY_RESEND_AFTER_SECONDS`` seconds, or overdue for their retry by as much. One query. Delivery is at least
    once: :func:`attempt` claims a row before it sends, but a notice cut off by a crash mid-send is sent again with the
    same ``X-AgentOps-Delivery`` id, on which receivers dedupe."""
    cutoff = timezone.now() - dt.timedelta(seconds=settings.NOTIFY_RESEND_AFTER_SECONDS)
    stuck = Q(status=DeliveryStatus.PENDING, created_at__lt=cutoff) | Q(status=DeliveryStatus.RETRYING, next_attempt_at__lt=cutoff)
    return list(Delivery.objects.filter(stuck).order_by("created_at").values_list("pk", flat=True)[:500])


def approver_emails(request: ApprovalRequest) -> list[str]:
    roles = request.approver_roles or list(DEFAULT_APPROVER_ROLES)
    emails = Membership.objects.filter(tenant_id=request.tenant_id, role__in=roles, user__is_active=True).exclude(user__email="")
    return sorted(set(emails.values_list("user__email", flat=True)))


# -- one attempt -------------------------------------------------------------------------------


class DeliveryFailed(Exception):
    def __init__(self, message: str, *, code: int | None = None, final: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.final = final


def _post(channel: NotificationChannel, delivery: Delivery, data: dict[str, Any]) -> int:
    body = json.dumps(slack_body(data) if channel.kind == ChannelKind.WEBHOOK_SLACK else json_body(data),
                      ensure_ascii=False, separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", "User-Agent": "AgentOps-Notify/1", "X-AgentOps-Event": data["event"],
               "X-AgentOps-Delivery": str(delivery.pk), TIMESTAMP_HEADER: timestamp}
    secret = secret_for(channel)
    if secret is not None:
        headers[SIGNATURE_HEADER] = sign(secret, timestamp, body)
    elif channel.secret_ref:
        raise DeliveryFailed("the signing secret is no longer available to this tenant; not sent unsigned", final=True)
    host = urlsplit(channel.target).hostname or "the target"
    try:
        with guarded_client(allow=settings.TOOL_EGRESS_ALLOW, timeout=10.0, follow_redirects=False,
                            max_response_bytes=64 * 1024, max_exchange_seconds=30.0) as http:  # a tenant's target
            response = http.post(channel.target, content=body, headers=headers)
    except EgressDenied as exc:
        raise DeliveryFailed(f"refused by the egress guard: {exc.reason}", final=True) from None
    except httpx.HTTPError as exc:  # the message may hold the URL (a Slack URL is a credential): name the host only
        raise DeliveryFailed(f"{exc.__class__.__name__} talking to {host}") from None
    if not 200 <= response.status_code < 300:
        raise DeliveryFailed(failure_reason(host, response.status_code), code=response.status_code)
    return response.status_code


def failure_reason(host: str, code: int) -> str:
    """What a refused delivery's row says: the host, the status and its standard phrase. Never the answer's body: a
    tenant's receiver writes it (it may echo the URL's token or a secret, or be written for whoever reads the admin)."""
    try:
        phrase = f" ({HTTPStatus(code).phrase})"
    except ValueError:
        phrase = ""
    return f"{host} answered HTTP {code}{phrase}; its answer is not kept"


def _mail(request: ApprovalRequest, data: dict[str, Any]) -> None:
    recipients = approver_emails(request)
    if not recipients:
        raise DeliveryFailed("no member who may approve this request has an email address", final=True)
    subject, body = email_text(data)
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, recipients, fail_silently=False)
    except OSError as exc:
        raise DeliveryFailed(f"the mail server refused or was unreachable ({exc.__class__.__name__})") from None


def attempt(delivery_id: Any) -> float | None:
    """Try one delivery once. Returns the seconds to wait before retrying it, or None when it is done (sent, failed
    for good, skipped, or taken by another worker). Every attempt is counted on the row, with its error and code."""
    delivery = Delivery.objects.select_related("channel", "channel__tenant", "request", "request__tenant", "request__tool",
                                               "request__run__agent").filter(pk=delivery_id).first()
    if delivery is None or delivery.status not in (DeliveryStatus.PENDING, DeliveryStatus.RETRYING):
        return None
    claimed = Delivery.objects.filter(pk=delivery.pk, attempts=delivery.attempts, status=delivery.status).update(
        attempts=F("attempts") + 1)
    if not claimed:
        return None  # another worker is on it
    delivery.attempts += 1
    request, channel = delivery.request, delivery.channel
    if request.status != ApprovalStatus.PENDING or not channel.enabled:
        _finish(delivery, DeliveryStatus.SKIPPED, f"not sent: the request is {request.status}" if channel.enabled
                else "not sent: the channel was switched off")
        return None
    data = facts(request, delivery.event)
    try:
        code = _post(channel, delivery, data) if channel.kind in WEBHOOKS else _mail(request, data)
    except DeliveryFailed as exc:
        final = exc.final or delivery.attempts >= settings.NOTIFY_MAX_ATTEMPTS
        delay = None if final else backoff(delivery.attempts)
        log.warning("approval notice %s (channel %s) attempt %s failed: %s", delivery.pk, channel.pk, delivery.attempts, exc)
        _finish(delivery, DeliveryStatus.FAILED if final else DeliveryStatus.RETRYING, str(exc), exc.code, delay)
        return delay
    _finish(delivery, DeliveryStatus.SENT, "", code)
    return None


def _finish(delivery: Delivery, status: str, error: str, code: int | None = None, delay: float | None = None) -> None:
    now = timezone.now()
    delivery.status, delivery.last_error, delivery.response_code = status, error[:1000], code
    delivery.next_attempt_at = now + dt.timedelta(seconds=delay) if delay is not None else None
    delivery.sent_at = now if status == DeliveryStatus.SENT else None
    delivery.save(update_fields=["status", "last_error", "response_code", "next_attempt_at", "sent_at"])


__all__ = ["NotifyEvent", "approval_url", "attempt", "backoff", "expiry_notices_due", "fan_out", "sign"]

"""Notification channel changes: validated, authorised, audited (``record_change``) in one transaction.

The admin and the API call these; they never write a channel row themselves. A channel's signing
secret is a reference (``secret:NAME``, read from ``NOTIFY_SECRET_<NAME>``) to a secret the platform
granted the tenant; the reference is write-only: the API, the admin and the audit row say "set", never it.
A webhook's host is resolved (the egress guard's check) before the channel's transaction begins and holding no
database connection (:func:`addresses_checked`): the tenant chose that name, and its DNS may answer slowly.
A webhook's URL is a credential too (whoever has a Slack webhook URL may post to the channel), so it is
write-only in effect: every reader, whatever their role, sees it masked (:func:`shown_target`), and writing
the masked form back keeps the stored URL (a read-modify-write through the API or the admin's form).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.db import transaction

from approvals.models import ChannelKind, NotificationChannel, NotifyEvent
from audit.services import record_change
from core.errors import Forbidden, Invalid
from core.remote_waits import remote_wait
from egress.guard import EgressDenied, check_url
from tenants.models import Tenant
from tenants.scoping import Actor
from tools.models import Tool

KEEP = object()
_SECRET_REF = re.compile(r"^secret:([A-Za-z0-9_]{1,64})$")
WEBHOOKS = (ChannelKind.WEBHOOK_SLACK, ChannelKind.WEBHOOK_JSON)


class ChannelInvalid(Invalid):
    """``errors`` maps a field to its problems, each worded for the operator (400, each field under its name)."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(p for problems in errors.values() for p in problems), field=next(iter(errors), None))

    def body(self) -> dict[str, Any]:
        return {**self.errors, "error": super().body()["error"]}


class ChannelRefused(Forbidden):
    """The actor may not change this tenant's channels (403)."""


def granted_secrets(tenant: Tenant) -> frozenset[str]:
    """The signing secrets a platform administrator granted ``tenant`` (its settings ``notify_secrets``)."""
    listed = (tenant.settings or {}).get("notify_secrets", [])
    return frozenset(str(name) for name in listed) if isinstance(listed, list) else frozenset()


def secret_for(channel: NotificationChannel) -> str | None:
    """The signing secret's value, or None when the channel has none (or it is no longer granted or set)."""
    match = _SECRET_REF.match(channel.secret_ref or "")
    if match is None or match.group(1) not in granted_secrets(channel.tenant):
        return None
    return settings.NOTIFY_SECRETS.get(match.group(1)) or None


#: A URL's path and query show their last characters only when there are at least this many (a Slack token's 24).
_TAIL_FROM = 16


def shown_target(target: str) -> str:
    """A webhook URL as anyone may read it: scheme, host and port, and the last 4 characters of a long path
    (``https://hooks.slack.com/…WXYZ``); empty for an email channel."""
    if not target:
        return ""
    parts = urlsplit(target)
    try:
        host = f"{parts.hostname or ''}:{parts.port}" if parts.port else (parts.hostname or "")
    except ValueError:  # a port out of range (saved before it was checked)
        host = parts.hostname or ""
    rest = target.split(parts.netloc, 1)[-1] if parts.netloc else target
    tail = rest[-4:] if len(rest) >= _TAIL_FROM else ""
    return f"{parts.scheme}://{host}/…{tail}"


def secret_status(channel: NotificationChannel) -> str:
    return "set" if channel.secret_ref else "not set"


def _secret_problem(raw: str, tenant: Tenant) -> str | None:
    match = _SECRET_REF.match(raw)
    if match is None:
        return "write the signing secret as secret:NAME (read from NOTIFY_SECRET_NAME); the secret itself is never stored here"
    if match.group(1) not in granted_secrets(tenant) or not settings.NOTIFY_SECRETS.get(match.group(1)):
        # One message whether the variable exists or not: a tenant learns nothing about the deployment's secrets.
        return f"the secret {match.group(1)} is not available to this tenant; ask a platform administrator to grant it"
    return None


def _target_problem(kind: str, target: str) -> str | None:
    if kind not in WEBHOOKS:
        return "an email channel mails the tenant's approvers; leave the target empty" if target else None
    if not target:
        return "a webhook needs its URL, e.g. https://hooks.example.com/approvals"
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http or https URL with a host, e.g. https://hooks.example.com/approvals; got {target[:100]!r}"
    if parts.username or parts.password:
        return "must not carry a user name or password; sign the body with a secret instead"
    ahead = _AHEAD.get() or {}
    address = _address(target)
    return ahead[address] if address in ahead else _egress_problem(target)


def _egress_problem(target: str) -> str | None:
    """The egress guard's verdict on a webhook URL (it resolves the host: a wait on the tenant's DNS)."""
    try:
        check_url(target, allow=settings.TOOL_EGRESS_ALLOW)
    except EgressDenied as exc:
        return exc.reason.replace("outbound calls from tools", "webhooks")
    except (httpx.HTTPError, OSError):
        return None  # a name that does not resolve now: the guard checks it again at every delivery, at connect time
    return None


#: Verdicts on webhook addresses resolved ahead of the transaction that saves a channel: (scheme, host, port) -> problem.
_AHEAD: ContextVar[dict[tuple[str, str, int | None], str | None] | None] = ContextVar("channel_addresses", default=None)
#: How long a host's resolution may take (the system resolver's own timeouts bound it; Python cannot interrupt it).
RESOLVE_SECONDS = 30.0


def _address(target: str) -> tuple[str, str, int | None] | None:
    """What the guard's verdict depends on: scheme, host and port (the same for the masked form of a stored URL)."""
    try:
        parts = urlsplit(target)
        return (parts.scheme, (parts.hostname or "").lower(), parts.port) if parts.hostname else None
    except ValueError:  # a port out of range: refused by the shape checks, nothing to resolve
        return None


@contextmanager
def addresses_checked(tenant_id: int | None, kind: Any, target: Any) -> Iterator[None]:
    """Resolve a webhook target's host now, in one of the tenant's remote-call slots and holding no database connection
    (core/remote_waits.py), for the checks made within the block, in the transaction that saves the channel.
    Raises :class:`~core.remote_waits.RemoteCallsBusy` when the tenant has its share of such calls under way."""
    known = _AHEAD.get() or {}
    address = _address(target) if kind in WEBHOOKS and isinstance(target, str) else None
    if address is None or address in known:
        yield
        return
    with remote_wait(tenant_id, seconds=RESOLVE_SECONDS, what="the check of the webhook's address"):
        problem = _egress_problem(target)
    token = _AHEAD.set({**known, address: problem})
    try:
        yield
    finally:
        _AHEAD.reset(token)


def _tools(tenant: Tenant, names: Iterable[Any], errors: dict[str, list[str]]) -> list[Tool]:
    """The tenant's own tools by name (or id); a name of another tenant's tool is simply not found here."""
    wanted = [str(getattr(n, "name", n)) for n in names]
    found = {t.name: t for t in Tool.objects.filter(tenant=tenant, name__in=wanted)}
    missing = [n for n in wanted if n not in found]
    if missing:
        errors.setdefault("tools", []).append(f"{tenant} has no tool named {', '.join(sorted(missing))}; name its own tools")
    return [found[n] for n in wanted if n in found]


def _validate(channel: NotificationChannel, errors: dict[str, list[str]]) -> None:
    if not channel.name.strip():
        errors.setdefault("name", []).append("give the channel a name")
    elif NotificationChannel.objects.filter(tenant_id=channel.tenant_id, name=channel.name).exclude(pk=channel.pk).exists():
        errors.setdefault("name", []).append(f"{channel.tenant} already has a channel named {channel.name!r}")
    if channel.kind not in ChannelKind.values:
        errors.setdefault("kind", []).append(f"must be one of {', '.join(ChannelKind.values)}; got {channel.kind!r}")
        return
    events = channel.events
    if not isinstance(events, list) or not events or any(e not in NotifyEvent.values for e in events):
        errors.setdefault("events", []).append(f"must be a non-empty list of {', '.join(NotifyEvent.values)}; got {events!r}")
    problem = _target_problem(channel.kind, channel.target)
    if problem:
        errors.setdefault("target", []).append(problem)
    if channel.kind == ChannelKind.WEBHOOK_JSON and not channel.secret_ref:
        errors.setdefault("secret", []).append("a JSON webhook is signed: give secret:NAME (Slack's URL is its own secret)")
    if channel.kind == ChannelKind.EMAIL and channel.secret_ref:
        errors.setdefault("secret", []).append("an email channel has no signing secret; leave it empty")


def _authorise(actor: Actor, tenant_id: int) -> None:
    actor.require("operate", tenant_id)  # not a member: 404; a viewer or approver: 403


def _said(channel: NotificationChannel, tools: list[Tool]) -> dict[str, Any]:
    """What the audit row may say: no secret, and of the URL (a Slack URL is a credential) only its host."""
    return {"name": channel.name, "kind": channel.kind, "target_host": urlsplit(channel.target).hostname or "",
            "events": channel.events, "tools": [t.name for t in tools], "enabled": channel.enabled,
            "secret": secret_status(channel)}


def _apply(
    channel: NotificationChannel, values: dict[str, Any], secret: Any, tools: Any, errors: dict[str, list[str]]
) -> list[Tool] | None:
    for name in ("name", "kind", "target", "events", "enabled"):
        if name in values:
            value = values[name]
            if name == "target" and channel.target and str(value).strip() == shown_target(channel.target):
                continue  # the masked URL read back: keep the stored one
            setattr(channel, name, value.strip() if isinstance(value, str) else value)
    if secret is not KEEP:
        raw = (secret or "").strip()
        problem = _secret_problem(raw, channel.tenant) if raw else None
        if problem:
            errors.setdefault("secret", []).append(problem)
        else:
            channel.secret_ref = raw
    return None if tools is KEEP else _tools(channel.tenant, tools or [], errors)


def create_channel(*, actor: Actor, tenant: Tenant, values: dict[str, Any], secret: Any = KEEP, tools: Any = KEEP) -> NotificationChannel:
    _authorise(actor, tenant.pk)
    with addresses_checked(tenant.pk, values.get("kind"), values.get("target")):  # before the transaction
        return _create_channel(actor=actor, tenant=tenant, values=values, secret=secret, tools=tools)


@transaction.atomic
def _create_channel(*, actor: Actor, tenant: Tenant, values: dict[str, Any], secret: Any, tools: Any) -> NotificationChannel:
    channel = NotificationChannel(tenant=tenant, name="", kind="", events=[])
    errors: dict[str, list[str]] = {}
    chosen = _apply(channel, values, secret, tools, errors) or []
    _validate(channel, errors)
    if errors:
        raise ChannelInvalid(errors)
    channel.save()
    channel.tools.set(chosen)
    record_change(tenant=tenant, actor=actor, action="notification_channel.create", target=channel, details=_said(channel, chosen))
    return channel


def update_channel(*, actor: Actor, channel: NotificationChannel, values: dict[str, Any], secret: Any = KEEP,
                   tools: Any = KEEP) -> NotificationChannel:
    _authorise(actor, channel.tenant_id)
    kind, target = values.get("kind", channel.kind), values.get("target", channel.target)
    with addresses_checked(channel.tenant_id, kind, target):  # before the transaction and the row's lock
        return _update_channel(actor=actor, channel=channel, values=values, secret=secret, tools=tools)


@transaction.atomic
def _update_channel(*, actor: Actor, channel: NotificationChannel, values: dict[str, Any], secret: Any,
                    tools: Any) -> NotificationChannel:
    channel = NotificationChannel.objects.select_for_update().select_related("tenant").get(pk=channel.pk)
    errors: dict[str, list[str]] = {}
    chosen = _apply(channel, values, secret, tools, errors)
    _validate(channel, errors)
    if errors:
        raise ChannelInvalid(errors)
    channel.save()
    if chosen is not None:
        channel.tools.set(chosen)
    else:
        chosen = list(channel.tools.all())
    said = _said(channel, chosen)
    if secret is not KEEP:
        said["secret"] = "replaced" if channel.secret_ref else "cleared"
    record_change(tenant=channel.tenant, actor=actor, action="notification_channel.update", target=channel, details=said)
    return channel


@transaction.atomic
def delete_channel(*, actor: Actor, channel: NotificationChannel) -> None:
    _authorise(actor, channel.tenant_id)
    record_change(tenant=channel.tenant, actor=actor, action="notification_channel.delete", target=channel,
                  details={"name": channel.name, "kind": channel.kind})
    channel.delete()

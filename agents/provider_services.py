"""Provider configuration changes: validated, authorised, audited (``record_change``) in one transaction.

The admin and the API call these; they never write a provider row themselves. Secrets (the API
key, header values) are encrypted here and never written to the audit row: it says "replaced".
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from agents.models import Provider
from agents.providers import (
    MAX_CALL_SECONDS,
    SecretError,
    check_api_key,
    check_fields,
    check_headers,
    encrypt_secret,
    granted_secrets,
    guarded_client_for,
    provider_config,
    secret_reference,
)
from audit.services import record_change
from core.errors import Forbidden, Invalid
from core.remote_waits import remote_wait
from llm import ConnectionCheck, ModelGateway
from tenants.models import Tenant
from tenants.scoping import Actor

#: Plain settings a service may set; ``api_key`` and ``default_headers`` are handled apart.
FIELDS = (
    "name", "kind", "base_url", "timeout", "max_retries", "offered_models",
    "requests_per_minute", "tokens_per_minute", "enabled",
)
KEEP = object()


class ProviderInvalid(Invalid, ValueError):
    """``errors`` maps a field to its problems, each worded for the operator (400, each field under its name)."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(p for problems in errors.values() for p in problems), field=next(iter(errors), None))

    def body(self) -> dict[str, Any]:
        return {**self.errors, "error": super().body()["error"]}


class ProviderRefused(Forbidden):
    """The actor may not change this provider (403)."""


def may_manage(actor: Actor, tenant_id: int | None) -> bool:
    """Shared providers (no tenant) are managed by superusers only; a tenant's by its operators."""
    if tenant_id is None:
        return actor.is_superuser
    return actor.can("operate", tenant_id)


def _authorise(actor: Actor, tenant_id: int | None) -> None:
    if not may_manage(actor, tenant_id):
        who = "superusers" if tenant_id is None else "owners and operators of its tenant"
        raise ProviderRefused(f"Only {who} may change this provider.")


def _apply_secrets(provider: Provider, api_key: Any, default_headers: Any, errors: dict[str, list[str]]) -> dict[str, Any]:
    """Set key/headers on the row (``KEEP`` leaves them; ``""``/``{}`` clears); returns what the audit row may say."""
    said: dict[str, Any] = {}
    # Deployment secrets (secret:NAME) only for shared providers or names granted to the tenant; never env:NAME.
    scope = {"platform": provider.tenant_id is None, "granted": granted_secrets(provider.tenant)}
    if api_key is not KEEP:
        raw = (api_key or "").strip()
        problems = check_api_key(raw, **scope) if raw else []
        if problems:
            errors.setdefault("api_key", []).extend(problems)
        elif not raw:
            provider.api_key_encrypted, provider.api_key_env = "", ""
            said["api_key"] = "cleared"
        elif secret_reference(raw) is not None:
            provider.api_key_encrypted, provider.api_key_env = "", f"secret:{secret_reference(raw)}"
            said["api_key"] = provider.api_key_env
        else:
            provider.api_key_encrypted, provider.api_key_env = encrypt_secret(raw), ""
            said["api_key"] = "replaced"
    if default_headers is not KEEP:
        headers = default_headers or {}
        problems = check_headers(headers, **scope)
        if problems:
            errors.setdefault("default_headers", []).extend(problems)
        else:
            provider.default_headers_encrypted = encrypt_secret(json.dumps(headers)) if headers else ""
            provider.default_header_names = sorted(headers)
            said["default_headers"] = sorted(headers)
    return said


def _check_unique(provider: Provider, errors: dict[str, list[str]]) -> None:
    clash = Provider.objects.filter(name=provider.name, tenant_id=provider.tenant_id).exclude(pk=provider.pk).exists()
    if clash:
        scope = "shared providers" if provider.tenant_id is None else "this tenant"
        errors.setdefault("name", []).append(f"name: {scope} already have a provider named {provider.name!r}")


@transaction.atomic
def create_provider(
    *, actor: Actor, tenant: Tenant | None, values: dict[str, Any], api_key: Any = KEEP, default_headers: Any = KEEP
) -> Provider:
    _authorise(actor, tenant.pk if tenant is not None else None)
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown provider fields: {sorted(unknown)}")
    provider = Provider(tenant=tenant, **values)
    errors = check_fields({f: getattr(provider, f) for f in FIELDS})
    said = _apply_secrets(provider, api_key, default_headers, errors)
    _check_unique(provider, errors)
    if errors:
        raise ProviderInvalid(errors)
    provider.save()
    details = {"values": {f: getattr(provider, f) for f in FIELDS}, **said}
    record_change(tenant=tenant, actor=actor, action="provider.created", target=provider, details=details)
    return provider


@transaction.atomic
def update_provider(
    *, actor: Actor, provider: Provider, values: dict[str, Any], api_key: Any = KEEP, default_headers: Any = KEEP
) -> Provider:
    provider = Provider.objects.select_for_update().get(pk=provider.pk)
    _authorise(actor, provider.tenant_id)
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown provider fields: {sorted(unknown)}")
    changes = {f: [getattr(provider, f), v] for f, v in values.items() if getattr(provider, f) != v}
    for field, value in values.items():
        setattr(provider, field, value)
    errors = check_fields({f: getattr(provider, f) for f in FIELDS})
    said = _apply_secrets(provider, api_key, default_headers, errors)
    _check_unique(provider, errors)
    if errors:
        raise ProviderInvalid(errors)
    if not changes and not said:
        return provider
    provider.save()
    record_change(
        tenant=provider.tenant, actor=actor, action="provider.changed", target=provider,
        details={"changes": changes, **said},
    )
    return provider


@transaction.atomic
def delete_provider(*, actor: Actor, provider: Provider) -> None:
    _authorise(actor, provider.tenant_id)
    record_change(tenant=provider.tenant, actor=actor, action="provider.deleted", target=provider,
                  details={"name": provider.name})
    provider.delete()


def check_connection(*, actor: Actor, provider: Provider) -> ConnectionCheck:
    """List the provider's models with its stored settings; a readable verdict, never an exception (but
    :class:`~core.remote_waits.RemoteCallsBusy` when the tenant already has its share of such calls under way)."""
    _authorise(actor, provider.tenant_id)
    try:
        config = provider_config(provider)  # everything read from the database before the wait
    except (SecretError, ValueError) as exc:
        return ConnectionCheck(False, provider.name, provider.base_url, str(exc))
    guarded = guarded_client_for(provider, config)
    gateway = ModelGateway([config], clients={provider.name: guarded} if guarded is not None else None)
    # Each attempt waits at most the provider's timeout (and MAX_CALL_SECONDS in all); the SDK retries max_retries times.
    seconds = min(config.timeout, MAX_CALL_SECONDS) * (config.max_retries + 1)
    try:
        with remote_wait(provider.tenant_id, seconds=seconds, what=f"the test of provider {provider.name!r}"):
            return gateway.test_connection(provider.name)
    finally:
        gateway.close()

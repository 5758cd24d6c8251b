"""Deployment checks of our own, run by ``manage.py check --deploy`` beside Django's."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connections


@register(Tags.security, deploy=True)
def metrics_token_set(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    if settings.METRICS_TOKEN:
        return []
    return [Warning(
        "METRICS_TOKEN is not set: /metrics answers anyone who can reach the server.",
        hint="Set METRICS_TOKEN and give Prometheus the same value (scrape_config: authorization: {credentials_file: ...}).",
        id="agentops.W001",
    )]


@register(Tags.database)
def no_atomic_requests(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """A request waiting on a tenant's server gives its database connection back first (core/remote_waits.py), which
    it cannot do inside a transaction: ATOMIC_REQUESTS would hold one open across every view, and the connection with it."""
    return [Error(
        f"DATABASES[{alias!r}] has ATOMIC_REQUESTS on: a request waiting on a tenant's server (an MCP import, a provider "
        "test) would hold its database connection for as long as that server takes.",
        hint="Leave ATOMIC_REQUESTS off; the services open their own transactions.",
        id="agentops.E001",
    ) for alias in connections if connections[alias].settings_dict.get("ATOMIC_REQUESTS")]

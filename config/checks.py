"""Deployment checks of our own, run by ``manage.py check --deploy`` beside Django's."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def metrics_token_set(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    if settings.METRICS_TOKEN:
        return []
    return [Warning(
        "METRICS_TOKEN is not set: /metrics answers anyone who can reach the server.",
        hint="Set METRICS_TOKEN and give Prometheus the same value (scrape_config: authorization: {credentials_file: ...}).",
        id="agentops.W001",
    )]

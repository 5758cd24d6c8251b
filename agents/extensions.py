"""The Django side of the extension table (:mod:`runtime.plugins`): the platform's allow-list, the
start-up check that reports broken extensions, and what ``manage.py list_extensions`` shows.

Installed packages contribute hook and interceptor classes through the entry-point groups
``agentops.hooks``, ``agentops.model_interceptors`` and ``agentops.tool_interceptors``; a version's policy
names them by kind. ``AGENTOPS_ALLOWED_EXTENSIONS`` (settings) restricts which contributed kinds are
usable (default ``["*"]``: every installed one); built-in kinds are always usable. Nothing here ever
imports a path a tenant wrote: tenants name kinds, and only kinds in the table are built.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Tags, register
from django.core.checks import Warning as CheckWarning

from runtime import plugins
from runtime.plugins import ExtensionRegistry

SETTING = "AGENTOPS_ALLOWED_EXTENSIONS"


def allowed_from_settings() -> list[str] | None:
    """The allow-list (kinds or patterns such as ``acme.*``); ``None`` when every installed kind is allowed."""
    allowed = getattr(settings, SETTING, ["*"])
    if allowed is None or "*" in allowed:
        return None
    return [str(pattern) for pattern in allowed]


def configure_from_settings(**_: Any) -> None:
    """Give the runtime the platform's allow-list (at start-up, and again when a test changes the setting)."""
    plugins.configure(allowed=allowed_from_settings())


def on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting == SETTING:
        configure_from_settings()


def registry() -> ExtensionRegistry:
    """The process-wide table (discovered on first use, with the platform's allow-list)."""
    return plugins.default_registry()


def describe() -> list[dict[str, Any]]:
    """Every extension: kind, role, entry-point group, source distribution, schema, availability and why not."""
    return [ext.describe() for ext in registry()]


@register(Tags.compatibility)
def unavailable_extensions(app_configs: Any = None, **kwargs: Any) -> list[CheckWarning]:
    """A broken or disallowed extension is a warning at start-up (``manage.py check``, ``migrate``, ``serve``),
    never a crash: versions cannot name it until it is fixed."""
    return [
        CheckWarning(
            f"Extension {ext.kind!r} ({ext.group}, from {ext.source}) is unavailable: {ext.reason}",
            hint=f"Versions cannot use it. See `manage.py list_extensions`; the allow-list is {SETTING}.",
            obj=ext.target or ext.kind,
            id="agentops.W002",
        )
        for ext in registry().unavailable()
    ]

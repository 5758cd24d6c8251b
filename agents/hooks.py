"""What the agents layer asks the marketplace above it, which registers the answers at start-up.

``agents`` imports nothing from ``marketplace`` (see .importlinter). Which tools a tenant may
resolve, whether a tool is released to a session, the scopes the tenant's plugin installs were
granted, the gray release's version for a session and the release gate's word on a new current version are the
marketplace's business: ``MarketplaceConfig.ready()`` registers them here. Unregistered, start-up fails (core/slots.py:
the agentops.E002 check).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from core import slots
from tools.models import Tool


class VersionRefused(Exception):
    """No version may start for this session (e.g. the agent's plugin is not enabled); the message says why."""


@dataclass
class MarketplaceHooks:
    #: tenant_id -> the Tool queryset a tenant's agents may resolve.
    resolvable_tools: Callable[[int], Any] | None = None
    #: (tool, tenant_id, session_key, as_read=False) -> (allowed, a reason the model can read).
    tool_allowed_for: Callable[..., tuple[bool, str]] | None = None
    #: tenant_id -> the scopes an owner granted to the tenant's live plugin installs.
    granted_scopes: Callable[[int], Iterable[str]] | None = None
    #: (agent, session_id) -> the released version for the session, None for the current one; raises VersionRefused.
    version_for_session: Callable[[Any, Any], Any] | None = None
    #: (agent, version or None, actor, audit=True) -> whether ``version`` may become the agent's current (stable) one:
    #: returns when it may (its audit row written when ``audit``), raises a DomainError when not (see refusals_recorded).
    admit_current: Callable[..., Any] | None = None


marketplace = MarketplaceHooks()
slots.declare("agents.hooks", "marketplace",
              lambda: [f.name for f in fields(marketplace) if getattr(marketplace, f.name) is None])


def register_marketplace(**hooks: Callable[..., Any]) -> None:
    """Called once by ``marketplace.apps.MarketplaceConfig.ready()``; an unknown name is a programming error."""
    for name, hook in hooks.items():
        if not hasattr(marketplace, name):
            raise TypeError(f"unknown marketplace hook {name!r}")
        setattr(marketplace, name, hook)


def resolvable_tools(tenant_id: int) -> Any:
    if marketplace.resolvable_tools is not None:
        return marketplace.resolvable_tools(tenant_id)
    return Tool.objects.for_tenant(tenant_id).filter(plugin_install__isnull=True)


def callable_tools(tenant_id: int) -> Any:
    """:func:`resolvable_tools` for a tool gateway: each with its plugin install and plugin, which its approval floor
    reads on its first call (``approvals.policy.declared_policy``), so that costs no query per tool, and its rollout:
    with those, a caller that calls the tool right after reading it decides its policy from what it read
    (:func:`tool_allowed_as_read`)."""
    return resolvable_tools(tenant_id).select_related("plugin_install__plugin", "rollout")


def tool_allowed_for(tool: Tool, tenant_id: int, session_key: Any) -> tuple[bool, str]:
    if marketplace.tool_allowed_for is not None:
        return marketplace.tool_allowed_for(tool, tenant_id, session_key)
    if tool.tenant_id != tenant_id:
        return False, f"There is no tool named {tool.name!r} here."
    if not tool.enabled:
        return False, f"The tool {tool.name} is switched off by an operator. Do not retry it; tell the user it is unavailable."
    return True, ""


def tool_allowed_as_read(tool: Tool, tenant_id: int, session_key: Any) -> tuple[bool, str]:
    """:func:`tool_allowed_for` for a tool :func:`callable_tools` read just now, right before this call (a flow node
    task's): decided from that row instead of reading the kill switch, install and rollout again."""
    if marketplace.tool_allowed_for is not None:
        return marketplace.tool_allowed_for(tool, tenant_id, session_key, as_read=True)
    return tool_allowed_for(tool, tenant_id, session_key)


def granted_scopes(tenant_id: int) -> set[str]:
    return {str(s) for s in marketplace.granted_scopes(tenant_id)} if marketplace.granted_scopes is not None else set()


def version_for_session(agent: Any, session_id: Any) -> Any:
    return marketplace.version_for_session(agent, session_id) if marketplace.version_for_session is not None else None


def admit_current(agent: Any, version: Any, actor: Any, *, audit: bool = True) -> None:
    """The release gate's word on ``version`` becoming the agent's current version (called under the agent's lock)."""
    if marketplace.admit_current is not None:
        marketplace.admit_current(agent, version, actor, audit=audit)


@contextmanager
def refusals_recorded() -> Iterator[None]:
    """Around a service's transaction: a hook's refusal may carry ``record_refusal``, which writes its audit rows. They
    are written here, once the change's transaction is rolled back, so the refusal is on record though the change is
    not (inside a caller's own transaction, they share its fate)."""
    try:
        yield
    except Exception as exc:
        record_refusal = getattr(exc, "record_refusal", None)
        if callable(record_refusal):
            record_refusal()
        raise

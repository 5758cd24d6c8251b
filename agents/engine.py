"""Assembles a runnable AgentLoop for one run from the database: the Django adapters meet the pure core."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from agents import hooks
from agents.extensions import registry as extension_registry
from agents.models import Run, Turn
from agents.run_policy import policy_for
from agents.store import DjangoRunStore
from approvals.gate import ApprovalGate
from audit.masking import mask_text
from audit.unit_of_work import StepAudit
from runtime.config import build_runtime
from runtime.context import ContextInput, assemble_context
from runtime.context import Turn as ContextTurn
from runtime.loop import AgentConfig, AgentLoop
from runtime.protocols import Checkpoint
from runtime.types import ToolSpec
from tools.gateway import ToolGateway
from tools.models import Tool

HISTORY_TURNS = 50


def _session_turns(session_id: Any) -> list[Turn]:
    return list(Turn.objects.filter(session_id=session_id).order_by("-turn_seq")[:HISTORY_TURNS])


def _version_tools(tenant_id: int, names: list[str]) -> list[Tool]:
    return list(hooks.callable_tools(tenant_id).filter(name__in=names).order_by("name"))


def initial_checkpoint(run: Run, model_info: Any, *, turns: list[Turn] | None = None) -> Checkpoint:
    """The context contributors' input, gathered from the database in a fixed number of queries.

    ``turns`` (newest first): the session's earlier turns when the caller has them (a replay gives the turns that
    came before the recorded run, read for many runs at once); else the session's latest turns are read.

    What the user typed is masked again here (idempotent; ``start_run`` stored it masked), so rows written
    before input masking or by other paths never bring raw personal data or secrets to the model.
    """
    raw = tuple(policy_for(run).policy.input_masking.raw)
    if turns is None:
        turns = _session_turns(run.session_id)
    turns = turns[:HISTORY_TURNS]
    history = [
        ContextTurn(t.turn_seq, [{"role": "user", "content": mask_text(t.user_message, keep=raw)},
                                 {"role": "assistant", "content": t.assistant_message}])
        for t in reversed(turns)
    ]
    facts = {**(run.session.facts or {}), **(run.facts or {})}  # masked by start_run; console-written keys kept verbatim
    tenant_settings = run.tenant.settings or {}
    return assemble_context(
        ContextInput(
            model=run.version.model,
            system_prompt=run.version.system_prompt,
            user_message=mask_text(run.input, keep=raw),
            history=history,
            tenant_facts=tenant_settings.get("facts", {}),
            business=facts,
            user_tier=facts.get("user_tier"),
            session_model_calls=run.session.model_calls,
            session_usage=run.session.usage or {},
            history_token_budget=model_info.context_window // 4 if model_info else None,
        )
    )


def visible_tools(run: Run) -> list[Tool]:
    """The version's tools among those the tenant may resolve (its own, and its live plugin installs')."""
    names = [n for n in run.version.tools if isinstance(n, str)]
    return _version_tools(run.tenant_id, names)


def approval_overrides(run: Run) -> dict[str, dict[str, Any]]:
    """Per-version approval policy overrides by tool name (``policy.approvals.tools``)."""
    return {name: dict(entry) for name, entry in policy_for(run).policy.approvals.tools.items()}


def session_grants(run: Run, plugin_scopes: set[str] | None = None) -> set[str]:
    """Scopes this conversation holds: those an owner consented to for the tenant's live plugin installs
    (``plugin_scopes`` when the caller already has them), the tenant's default scopes, and what the client granted
    the session or run (``grants`` in facts)."""
    granted = set((run.tenant.settings or {}).get("default_scopes", []))
    granted.update(hooks.granted_scopes(run.tenant_id) if plugin_scopes is None else plugin_scopes)
    for source in (run.session.facts or {}, run.facts or {}):
        grants = source.get("grants", [])
        if isinstance(grants, list):
            granted.update(str(g) for g in grants)
    return granted


def build_loop(run: Run, lease_token: str) -> AgentLoop:
    from agents.model_clients import model_client_for, model_info_for

    tools = visible_tools(run)
    enabled = [t for t in tools if t.enabled]
    info = model_info_for(run)
    extensions = extension_registry()  # the hook/interceptor kinds the platform allows (entry points + built-ins)
    policy = policy_for(run)  # parsed once for the run (routing and approvals read the same), never edited after
    config = AgentConfig(
        model=run.version.model,
        system_prompt=run.version.system_prompt,
        tools=[ToolSpec(t.name, t.description, t.parameters or {"type": "object", "properties": {}}) for t in enabled],
        input_price_per_million=info.price_in_per_1m if info else 0.0,
        output_price_per_million=info.price_out_per_1m if info else 0.0,
        context_window=info.context_window if info else 128_000,
        tool_calls_at_once=int(settings.TOOL_CALLS_AT_ONCE),
    )
    runtime = build_runtime(policy, config, extensions=extensions)  # instantiates the policy's hooks and interceptors
    audit = StepAudit()  # the step's audit rows: the gateway adds them, the store commits them with the step
    store = DjangoRunStore(run, lease_token, initial=lambda: initial_checkpoint(run, info), audit=audit)
    gateway = ToolGateway(run=run, tools=tools, audit=audit, grants=session_grants(run),
                          approvals=ApprovalGate(run, overrides=approval_overrides(run)), tool_policy=hooks.tool_allowed_for)
    return runtime.loop(model_client_for(run), gateway, store)

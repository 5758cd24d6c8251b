"""Assembles a runnable AgentLoop for one run from the database: the Django adapters meet the pure core."""

from __future__ import annotations

from typing import Any

from agents.models import Run, Turn
from agents.runtime.loop import AgentConfig, AgentLoop
from agents.runtime.types import Message, ToolSpec
from agents.store import DjangoRunStore
from tools.gateway import ToolGateway
from tools.models import Tool

HISTORY_TURNS = 20


def initial_messages(run: Run) -> list[Message]:
    messages: list[Message] = []
    if run.version.system_prompt:
        messages.append({"role": "system", "content": run.version.system_prompt})
    turns = list(Turn.objects.filter(session_id=run.session_id).order_by("-turn_seq")[:HISTORY_TURNS])
    for turn in reversed(turns):
        messages.append({"role": "user", "content": turn.user_message})
        messages.append({"role": "assistant", "content": turn.assistant_message})
    messages.append({"role": "user", "content": run.input})
    return messages


def visible_tools(run: Run) -> list[Tool]:
    names = [n for n in run.version.tools if isinstance(n, str)]
    return list(Tool.objects.for_tenant(run.tenant_id).filter(name__in=names, enabled=True).order_by("name"))


def build_loop(run: Run, lease_token: str) -> AgentLoop:
    from agents.model_clients import model_client_for

    tools = visible_tools(run)
    audit_buffer: list[Any] = []
    config = AgentConfig(
        model=run.version.model,
        system_prompt=run.version.system_prompt,
        tools=[ToolSpec(t.name, t.description, t.parameters or {"type": "object", "properties": {}}) for t in tools],
        max_recursion=int((run.version.policy or {}).get("max_recursion", 10)),
    )
    store = DjangoRunStore(run, lease_token, initial_messages=initial_messages(run), audit_buffer=audit_buffer)
    gateway = ToolGateway(run=run, tools=tools, audit_buffer=audit_buffer)
    return AgentLoop(config, model_client_for(run), gateway, store)

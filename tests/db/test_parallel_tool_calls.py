"""A model turn's tool calls run side by side through the real path (``services.execute_run`` -> engine -> the tool
gateway's ``start``/``result`` -> DjangoRunStore): each passes the gateway's checks in the run's thread, then the
calls run together on their tools' threads; results, trace and audit rows come back in the model's order."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from agents import model_clients, services
from agents.models import Run, RunEvent, RunMessage
from audit.models import ToolCallAudit
from runtime.scripted import ScriptedModel, calls, say
from tenants.scoping import actor_for_user
from tests.factories import World, make_world
from tools.pyfunc import registry, tool
from tools.services import install_python_tool

pytestmark = pytest.mark.django_db

#: Where the turn's calls meet (a fresh barrier per test), and the write tool's side effects.
MEETING: dict[str, threading.Barrier] = {}
NOTES: list[str] = []

if "test_turn.meet" not in registry:

    @tool(key="test_turn.meet", category="read")
    def turn_meet(who: str) -> dict[str, Any]:
        """Wait until the turn's other calls are here too (test tool): only calls running together all meet."""
        MEETING["barrier"].wait(timeout=3)
        return {"who": who, "met": True}

    @tool(key="test_turn.note", category="write")
    def turn_note(text: str) -> dict[str, Any]:
        """Write a note (test tool with a side effect): meets the others too."""
        MEETING["barrier"].wait(timeout=3)
        NOTES.append(text)
        return {"noted": text}


@pytest.fixture
def world() -> World:
    NOTES.clear()
    world = make_world()
    for key in ("test_turn.meet", "test_turn.note"):
        install_python_tool(tenant=world.tenant, key=key, actor=None)
    world.version.tools = [*world.version.tools, "turn_meet", "turn_note"]
    world.version.save(update_fields=["tools"])
    return world


def _run(world: World, monkeypatch: pytest.MonkeyPatch, model: ScriptedModel) -> Run:
    monkeypatch.setattr(model_clients, "model_client_for", lambda run: model)
    run = services.start_run(actor=actor_for_user(world.operator), agent=world.agent, text="meet, all of you")
    services.execute_run(str(run.pk))
    return Run.objects.get(pk=run.pk)


def test_a_turns_tool_calls_run_side_by_side_through_the_gateway(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    MEETING["barrier"] = threading.Barrier(3)
    turn = calls([("turn_meet", {"who": "a"}), ("turn_note", {"text": "hello"}), ("turn_meet", {"who": "b"})])
    run = _run(world, monkeypatch, ScriptedModel([turn, say("all met")]))
    assert run.terminal_reason == "final_answer", run.error
    assert NOTES == ["hello"], "the write ran once"
    ids = [c.id for c in turn.tool_calls]
    tool_messages = [m.message for m in RunMessage.objects.filter(run=run).order_by("index") if m.message["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ids, "results in the model's order"
    assert [json.loads(m["content"]) for m in tool_messages] == [{"who": "a", "met": True}, {"noted": "hello"},
                                                                  {"who": "b", "met": True}]
    audit = list(ToolCallAudit.objects.filter(run_id=run.pk).order_by("id"))
    assert sorted((a.call_id, a.status) for a in audit) == sorted((i, "ok") for i in ids), "one row per call, each ok"
    write = next(a for a in audit if a.tool_name == "turn_note")
    assert write.idempotency_key == f"{run.pk}:1:{ids[1]}", "the write's started row was committed before it ran"
    traced = [e.payload["call_id"] for e in RunEvent.objects.filter(run=run, type="tool.call").order_by("seq")]
    assert traced == ids


def test_tool_calls_at_once_1_runs_a_turns_calls_one_after_another(world: World, monkeypatch: pytest.MonkeyPatch,
                                                                    settings: Any) -> None:
    """The deployment's bound reaches the runtime (agents/engine.py): at 1 the two calls never meet (the first waits
    alone until its barrier breaks, the second finds it broken)."""
    settings.TOOL_CALLS_AT_ONCE = 1
    MEETING["barrier"] = threading.Barrier(2)
    turn = calls([("turn_meet", {"who": "a"}), ("turn_meet", {"who": "b"})])
    run = _run(world, monkeypatch, ScriptedModel([turn, say("nobody met")]))
    assert run.terminal_reason == "final_answer", run.error
    assert sorted(ToolCallAudit.objects.filter(run_id=run.pk).values_list("status", flat=True)) == ["error", "error"]

"""OpenTelemetry spans from a run's committed events, in-process: names, one trace, parents, usage; off by default.

A real run goes through ``services.execute_run`` (demo planner, real tool gateway); its steps' on-commit
callbacks are executed, so the spans are the ones a worker would export.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from agents import otel, services
from agents.models import Run
from tenants.scoping import actor_for_user
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Tracing on, into memory, synchronously; off again (decided from the environment) afterwards."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.setattr(django_settings, "OTEL_EXPORTER_OTLP_ENDPOINT", "")
    exporter = InMemorySpanExporter()
    otel.configure(SimpleSpanProcessor(exporter))
    yield exporter
    otel.shutdown()


@pytest.fixture
def run_demo(django_capture_on_commit_callbacks: Callable[..., Any]) -> Callable[[World, str], Run]:
    def run(world: World, text: str) -> Run:
        started = services.start_run(actor=actor_for_user(world.operator), agent=world.agent, text=text)
        with django_capture_on_commit_callbacks(execute=True):
            services.execute_run(str(started.pk))
        started.refresh_from_db()
        return started

    return run


def test_a_finished_run_is_one_trace_of_invoke_agent_chat_and_execute_tool_spans(exported: Any, run_demo: Any) -> None:
    # given the demo agent; when it answers a question about an order's shipment
    world = make_world()
    run = run_demo(world, "where is order O202411280001?")
    assert run.terminal_reason == "final_answer"
    spans = exported.get_finished_spans()
    names = [s.name for s in spans]
    # then there is one invoke_agent span, a chat span per model call and an execute_tool span per tool call
    assert names.count("invoke_agent order-assistant") == 1
    assert names.count("chat demo/planner") == run.state["llm_call_count"] == 2
    assert names.count("execute_tool query_logistics") == 1
    root = next(s for s in spans if s.name.startswith("invoke_agent"))
    # and all of them are one trace, the run's id, with the model and tool calls children of the run
    assert {s.context.trace_id for s in spans} == {run.pk.int}
    assert root.parent is None
    assert f"{root.context.span_id:016x}" == run.state["_root_span"]
    for child in (s for s in spans if s is not root):
        assert child.parent is not None and child.parent.span_id == root.context.span_id, child.name
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time, child.name
    # and the spans carry the GenAI attributes: operation, agent, model, tool, usage, outcome
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.agent.name"] == "order-assistant"
    assert root.attributes["gen_ai.agent.id"] == str(world.agent.pk)
    assert root.attributes["agentops.run.id"] == str(run.pk)
    assert root.attributes["agentops.run.terminal_reason"] == "final_answer"
    assert root.attributes["gen_ai.usage.input_tokens"] == run.usage["input_tokens"] > 0
    assert root.attributes["gen_ai.usage.output_tokens"] == run.usage["output_tokens"] > 0
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert sum(s.attributes["gen_ai.usage.input_tokens"] for s in chats) == run.usage["input_tokens"]
    assert sum(s.attributes["gen_ai.usage.output_tokens"] for s in chats) == run.usage["output_tokens"]
    assert all(s.attributes["gen_ai.operation.name"] == "chat" for s in chats)
    assert all(s.attributes["gen_ai.request.model"] == s.attributes["gen_ai.response.model"] == "demo/planner" for s in chats)
    assert sorted(s.attributes["gen_ai.response.finish_reasons"][0] for s in chats) == ["stop", "tool_calls"]
    tool = next(s for s in spans if s.name.startswith("execute_tool"))
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "query_logistics"
    assert tool.attributes["gen_ai.tool.call.id"].startswith("call_")
    assert tool.attributes["agentops.tool.status"] == "ok"
    # and nothing the model or the tool said, nor the tool's arguments, is in a span
    for span in spans:
        assert "O202411280001" not in repr(dict(span.attributes)), span.name


def test_a_run_cancelled_before_any_worker_took_it_is_a_lone_invoke_agent_span(
    exported: Any, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    # given a queued run that no worker took; when an operator cancels it
    world = make_world()
    run = services.start_run(actor=actor_for_user(world.operator), agent=world.agent, text="hi")
    with django_capture_on_commit_callbacks(execute=True):
        services.cancel_run(actor=actor_for_user(world.operator), run=Run.objects.get(pk=run.pk))
    # then the run is still one root span in its own trace, saying how it ended
    (span,) = exported.get_finished_spans()
    assert span.name == "invoke_agent order-assistant"
    assert span.parent is None and span.context.trace_id == run.pk.int
    assert span.attributes["agentops.run.terminal_reason"] == "cancelled"


def test_with_the_environment_unset_a_run_builds_no_tracer(
    monkeypatch: pytest.MonkeyPatch, run_demo: Any
) -> None:
    # given no OTLP endpoint and a process that has not decided yet
    monkeypatch.setattr(django_settings, "OTEL_EXPORTER_OTLP_ENDPOINT", "")
    otel.shutdown()
    monkeypatch.setattr(otel, "configure", lambda *a, **k: pytest.fail("configure() must not run without an endpoint"))
    # when a whole run commits
    run = run_demo(make_world(), "where is order O202411280001?")
    # then tracing was decided off, once
    assert run.terminal_reason == "final_answer"
    assert otel._decided and otel._tracer is None
    otel.shutdown()


def test_without_an_endpoint_nothing_is_traced_and_the_sdk_is_never_imported() -> None:
    # given the environment without OTEL_EXPORTER_OTLP_ENDPOINT; when a process commits a run's events
    script = (
        "import sys, django; django.setup()\n"
        "from types import SimpleNamespace as NS\n"
        "import datetime as dt, uuid\n"
        "from agents import otel, store\n"
        "at = dt.datetime.now(dt.UTC)\n"
        "row = NS(type='run.finished', span_id='a' * 16, parent_span_id='', payload={'terminal_reason': 'final_answer'}, at=at)\n"
        "otel.observe_committed(NS(pk=uuid.uuid4()), [row])\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk') or m.startswith('opentelemetry.exporter')))\n"
        "print(otel._decided, otel._tracer)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    # then it decided "off" once and imported nothing of the SDK or the exporter
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == ["[]", "True None"]

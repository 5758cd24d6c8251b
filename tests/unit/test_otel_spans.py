"""The spans a step's committed rows make (``agents.otel.span_specs``), without a database."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from agents import otel

AT = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
ROOT = "9661a96bd6584198"


def _row(type_: str, span_id: str, parent: str = ROOT, seconds: float = 0.0, **payload: Any) -> SimpleNamespace:
    return SimpleNamespace(type=type_, span_id=span_id, parent_span_id=parent, payload=payload, at=AT + dt.timedelta(seconds=seconds))


def _run(**extra: Any) -> SimpleNamespace:
    fields: dict[str, Any] = dict(pk=uuid.uuid4(), agent_id=7, session_id=uuid.uuid4(), version_id=3, tenant_id=1, step=2,
                                  state={"_root_span": ROOT}, usage={"input_tokens": 10, "output_tokens": 4, "cost": 0.5},
                                  started_at=AT - dt.timedelta(seconds=1), created_at=AT - dt.timedelta(seconds=2))
    fields.update(extra)
    return SimpleNamespace(**fields)


def test_a_failed_model_call_and_a_timed_out_tool_call_are_error_spans_with_their_own_windows() -> None:
    # given a step whose model call failed over twice and whose tool call timed out
    run = _run()
    rows = [
        _row("model.attempt", "aaaaaaaaaaaaaaa1", "b000000000000001", provider="openai", target="openai/gpt-x", outcome="server_error",
             latency_ms=100),
        _row("model.attempt", "aaaaaaaaaaaaaaa2", "b000000000000001", provider="backup", target="backup/m", outcome="timeout",
             latency_ms=200),
        _row("model.error", "b000000000000001", model="openai/gpt-x", task="act", error="provider said: secret-ish text"),
        _row("tool.call", "c000000000000001", seconds=1, tool="refund", call_id="call_9", status="timeout", latency_ms=1500,
             result="arguments and results never leave"),
    ]
    # when its spans are derived
    chat, tool = otel.span_specs(run, rows)
    # then both are children of the run's span, in the run's trace, and marked failed
    assert (chat.name, tool.name) == ("chat openai/gpt-x", "execute_tool refund")
    assert {chat.trace_id, tool.trace_id} == {run.pk.int}
    assert chat.parent_id == tool.parent_id == int(ROOT, 16)
    assert (chat.error, tool.error) == ("timeout", "timeout")
    assert chat.end_ns - chat.start_ns == 300_000_000, "a failed call lasts as long as its attempts"
    assert tool.end_ns - tool.start_ns == 1_500_000_000
    assert chat.attributes["gen_ai.provider.name"] == "backup"
    assert chat.attributes["agentops.model.attempts"] == 2
    assert "gen_ai.usage.input_tokens" not in chat.attributes
    assert "secret-ish" not in repr(chat.attributes) and "never leave" not in repr(tool.attributes)


def test_the_run_span_has_the_root_id_starts_when_the_run_started_and_sums_usage() -> None:
    run = _run()
    (root,) = otel.span_specs(run, [_row("run.finished", "d000000000000001", seconds=3, terminal_reason="error")], "order-assistant")
    assert root.name == "invoke_agent order-assistant"
    assert (root.span_id, root.parent_id, root.trace_id) == (int(ROOT, 16), 0, run.pk.int)
    assert root.end_ns - root.start_ns == 4_000_000_000
    assert root.attributes["gen_ai.usage.input_tokens"] == 10 and root.attributes["gen_ai.usage.output_tokens"] == 4
    assert root.error == "error"


def test_span_ids_that_are_not_16_hex_digits_get_a_stable_nonzero_id() -> None:
    run_id = uuid.uuid4()
    assert otel.span_id_of(run_id, "not-hex") == otel.span_id_of(run_id, "not-hex") != 0
    assert otel.span_id_of(run_id, "0" * 16) != 0
    assert otel.span_id_of(run_id, "00000000000000ff") == 255


@pytest.fixture
def sampled_out(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    exporter = InMemorySpanExporter()
    otel.configure(SimpleSpanProcessor(exporter))
    yield exporter
    otel.shutdown()


def test_a_run_the_sampler_drops_loses_its_child_spans_too(sampled_out: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a sampler that keeps no trace; when a step with a tool call commits
    monkeypatch.setattr(otel.transaction, "on_commit", lambda callback: callback())
    otel.observe_committed(_run(), [_row("tool.call", "c000000000000001", tool="t", call_id="c", status="ok", latency_ms=1)])
    # then its span is dropped like the run's root span would be, instead of dangling without a parent
    assert sampled_out.get_finished_spans() == ()


def test_the_same_step_is_exported_when_the_sampler_keeps_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    otel.configure(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(otel.transaction, "on_commit", lambda callback: callback())
    try:
        otel.observe_committed(_run(), [_row("tool.call", "c000000000000001", tool="t", call_id="c", status="ok", latency_ms=1)])
    finally:
        otel.shutdown()
    (span,) = exporter.get_finished_spans()
    assert span.name == "execute_tool t" and span.parent is not None and span.parent.span_id == int(ROOT, 16)

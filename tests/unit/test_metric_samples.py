"""What a step's committed rows add to the run-limit and model-gateway metrics (``agents.metrics.samples``), no database."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agents import metrics


def _row(type_: str, span_id: str = "s1", parent: str = "root", **payload: Any) -> SimpleNamespace:
    return SimpleNamespace(type=type_, span_id=span_id, parent_span_id=parent, payload=payload)


def _of(metric: Any, observations: list[tuple[Any, dict[str, str], str, float]]) -> list[tuple[dict[str, str], float]]:
    return [(labels, value) for m, labels, _how, value in observations if m is metric]


def test_a_run_stopped_by_a_limit_counts_the_limit_that_decided() -> None:
    rows = [_row("run.finished", terminal_reason="limit_reached", decided_by="model_call_limit")]
    out = metrics.samples("order-assistant", 7, rows)
    assert _of(metrics.RUN_LIMITS, out) == [({"agent": "order-assistant", "limit": "model_call_limit"}, 1.0)]
    assert _of(metrics.RUNS, out) == [({"agent": "order-assistant", "status": "limit_reached"}, 1.0)]


def test_a_limit_without_a_deciding_hook_is_named_by_its_terminal_reason() -> None:
    out = metrics.samples("a", 11, [_row("run.finished", terminal_reason="max_recursion", decided_by=None)])
    assert _of(metrics.RUN_LIMITS, out) == [({"agent": "a", "limit": "max_recursion"}, 1.0)]


def test_runs_that_answer_fail_or_are_rejected_hit_no_limit() -> None:
    for reason in ("final_answer", "error", "rejected", "cancelled"):
        out = metrics.samples("a", 2, [_row("run.finished", terminal_reason=reason, decided_by="some_hook")])
        assert _of(metrics.RUN_LIMITS, out) == [], reason


def test_model_attempts_count_by_provider_and_outcome_and_a_failed_call_by_model() -> None:
    rows = [
        _row("model.attempt", "a1", "m1", provider="openai", model="gpt", outcome="server_error", status_code=502),
        _row("model.attempt", "a2", "m1", provider="local", model="small", outcome="ok", status_code=200),
        _row("model.error", "m1", model="default", task="agent", error="all routes failed"),
    ]
    out = metrics.samples("", 1, rows)
    assert _of(metrics.LLM_ATTEMPTS, out) == [({"provider": "openai", "outcome": "server_error"}, 1.0),
                                             ({"provider": "local", "outcome": "ok"}, 1.0)]
    assert _of(metrics.LLM_ERRORS, out) == [({"model": "default"}, 1.0)]

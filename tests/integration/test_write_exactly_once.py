"""Exactly-once writes on the live stack: a worker killed during a write call leaves exactly one request at the target.

The target is a local HTTP server in the test process. Its POST handler records the request
(path, Idempotency-Key) at once and then sleeps, so the worker is inside the call when it is
SIGKILLed. The sweeper puts the run back on the queue once its lease expired; the resumed step
finds the write's ``started`` audit row (tools/gateway.py): a non-idempotent tool is not called
again and is reported ``outcome_unknown``; an idempotent one is called again with the same
Idempotency-Key, so the target can dedupe. Both run modes run every test: no skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agents.models import Run, RunEvent, RunMessage
from audit.chain import verify_tenant
from audit.models import ToolCallAudit
from tests.factories import World, make_world
from tests.support.live_stack import ROOT, LiveStack, make_live_stack, replace_executor
from tools.models import Tool, ToolCategory, ToolKind

pytestmark = pytest.mark.integration

#: The sweeper runs every second here (the stacks' lease is TEST_RUN_LEASE_SECONDS, 8 s by default).
FAST_SWEEP = {"SWEEP_INTERVAL_SECONDS": "1"}
#: How long the target holds the first request for a key: the worker is killed inside this window.
HOLD_SECONDS = 4.0


class SlowRefundTarget(BaseHTTPRequestHandler):
    """Records each request before doing anything else, holds the first one per key, dedupes repeats."""

    requests: list[dict[str, Any]] = []
    results: dict[str, bytes] = {}
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)) or 0)
        key = self.headers.get("Idempotency-Key") or ""
        with SlowRefundTarget.lock:
            SlowRefundTarget.requests.append({"path": self.path, "key": key})
            earlier = SlowRefundTarget.results.get(key) if key else None
        if earlier is None:
            time.sleep(HOLD_SECONDS)  # the effect happens here; the caller may be gone by the time we answer
            earlier = json.dumps({"refund_id": f"R-{len(SlowRefundTarget.requests)}", "status": "refunded"}).encode()
            if key:
                with SlowRefundTarget.lock:
                    SlowRefundTarget.results[key] = earlier
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(earlier)))
            self.end_headers()
            self.wfile.write(earlier)
        except OSError:
            pass  # the caller was SIGKILLed while we held its request

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowRefundTarget)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, django_db_setup: Any) -> LiveStack | None:
    """Production: the session's stack, with a Celery beat process (the sweeper) next to its worker.
    Embedded: None; each test starts stacks of its own, since killing the worker means killing the server."""
    if not os.environ.get("REDIS_URL"):
        return None
    live_stack: LiveStack = request.getfixturevalue("live_stack")
    if "beat" not in live_stack.processes:
        log = open(live_stack.logdir / "beat.log", "ab")  # noqa: SIM115 - lives as long as the process
        schedule = str(live_stack.logdir / "celerybeat-schedule")
        live_stack.processes["beat"] = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel=INFO", "-s", schedule],
            cwd=ROOT, env={**live_stack.env, **FAST_SWEEP}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    return live_stack


def _refund_world(target: str, *, idempotent: bool) -> World:
    """A tenant whose order assistant may call an HTTP refund tool (a write, no approval needed)."""
    world = make_world()
    Tool.objects.create(
        tenant=world.tenant,
        name="refund_order",
        kind=ToolKind.HTTP,
        category=ToolCategory.WRITE,
        idempotent=idempotent,
        requires_approval=False,
        description="Refund an order (refund, 退款). Use only when the user asks for a refund of an order.",
        parameters={
            "type": "object",
            "properties": {"order_id": {"type": "string", "pattern": "^O\\d{12}$"}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
        config={"method": "POST", "url": target + "/refunds/{order_id}", "allow_hosts": ["127.0.0.1"]},
    )
    world.version.tools = [*world.version.tools, "refund_order"]
    world.version.save(update_fields=["tools"])
    return world


def _requests_for(order: str) -> list[dict[str, Any]]:
    with SlowRefundTarget.lock:
        return [r for r in SlowRefundTarget.requests if r["path"] == f"/refunds/{order}"]


def _wait_for_request(order: str, run_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not _requests_for(order):
        if time.monotonic() > deadline:
            run = Run.objects.get(pk=run_id)
            raise AssertionError(f"the target got no request for {order} in {timeout}s (run {run.status}, step {run.step})")
        time.sleep(0.02)


def _kill_during_the_call_and_resume(stack: LiveStack | None, world: World, order: str) -> tuple[str, dict[str, Any]]:
    """Start a refund run, SIGKILL the process executing it while the target holds the request, let a new one finish it.

    Production: SIGKILL the worker process, start another. Embedded: the worker is a thread of the
    server, so SIGKILL a server (a stack of its own) and start another server on the same database."""
    own: list[LiveStack] = []
    try:
        victim = stack if stack is not None else _own_stack(own)
        # given a run whose write call has reached the target, which has not answered yet
        with victim.client(world.raw_key) as http:
            response = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": f"please refund order {order}"})
        assert response.status_code == 202, response.text
        run_id = str(response.json()["id"])
        _wait_for_request(order, run_id)
        started = ToolCallAudit.objects.get(run_id=run_id, tool_name="refund_order")
        assert started.status == "started" and started.idempotency_key, "the intent is committed before the request is sent"
        # when the process executing it is SIGKILLed mid-call
        victim.kill_executor()
        killed = Run.objects.get(pk=run_id)
        assert killed.status == "running" and killed.step == 0, "the killed step never committed"
        # and a new worker starts; the sweeper re-enqueues the run once the dead worker's lease expired
        successor = replace_executor(victim, own, FAST_SWEEP)
        body = successor.wait_for_run(world.raw_key, run_id, timeout=90)
    finally:
        for s in own:
            s.stop()
    return run_id, body


def _own_stack(own: list[LiveStack]) -> LiveStack:
    new = make_live_stack(FAST_SWEEP)
    own.append(new)
    return new


def _assert_whole_trace(run_id: str) -> None:
    events = list(RunEvent.objects.filter(run_id=run_id).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "no gap and no duplicate in seq"
    types = [e.type for e in events]
    assert types.count("run.started") == 1 and types.count("run.finished") == 1
    model_steps = [e.step for e in events if e.type == "model.call"]
    assert model_steps == sorted(set(model_steps)), f"each step's model call was recorded once: {model_steps}"
    assert [e.payload.get("tool") for e in events if e.type == "tool.call"] == ["refund_order"]
    indexes = list(RunMessage.objects.filter(run_id=run_id).order_by("index").values_list("index", flat=True))
    assert indexes == list(range(len(indexes))), "the message log has no gap and no duplicate"


def _the_one_audit_row(world: World, run_id: str) -> ToolCallAudit:
    rows: list[ToolCallAudit] = list(ToolCallAudit.objects.filter(run_id=run_id, tool_name="refund_order"))
    assert len(rows) == 1, [(r.call_id, r.status) for r in rows]
    row = rows[0]
    assert ToolCallAudit.objects.filter(run_id=run_id, call_id=row.call_id).count() == 1
    assert row.chain_seq is not None and row.row_hash, "the completed row is sealed in the tenant's chain"
    checked, broken = verify_tenant(world.tenant.pk)
    assert broken is None and checked >= 1, broken
    return row


def _assert_audit_joins_transcript(run_id: str) -> None:
    """Every audit row of the run joins a tool message of its log: ``tool_call_id in attempt_call_ids`` (issue #13, 4)."""
    tool_ids = [m.message.get("tool_call_id") for m in RunMessage.objects.filter(run_id=run_id) if m.message.get("role") == "tool"]
    rows = list(ToolCallAudit.objects.filter(run_id=run_id))
    assert rows
    for row in rows:
        assert row.attempt_call_ids and row.attempt_call_ids[-1] == row.call_id, (row.call_id, row.attempt_call_ids)
        joined = [i for i in tool_ids if i in row.attempt_call_ids]
        assert len(joined) == 1, (row.tool_name, row.status, row.attempt_call_ids, tool_ids)


def _tool_messages(run_id: str) -> list[str]:
    return [str(m.message.get("content", "")) for m in RunMessage.objects.filter(run_id=run_id) if m.message.get("role") == "tool"]


def test_a_non_idempotent_write_cut_off_by_a_kill_is_not_repeated_and_reported_outcome_unknown(
    stack: LiveStack | None, target: str, unblocked_db: None
) -> None:
    world = _refund_world(target, idempotent=False)
    run_id, body = _kill_during_the_call_and_resume(stack, world, "O202411280011")
    # then the target got the request exactly once, and the run finished on the new worker
    assert len(_requests_for("O202411280011")) == 1, _requests_for("O202411280011")
    assert body["status"] == "finished" and body["terminal_reason"] == "final_answer", body
    assert Run.objects.get(pk=run_id).crash_count == 1
    # and the call's one audit row says the outcome is unknown, and the model was told it was not repeated
    row = _the_one_audit_row(world, run_id)
    assert row.status == "outcome_unknown" and "not repeated" in row.error, (row.status, row.error)
    assert row.idempotency_key == _requests_for("O202411280011")[0]["key"]
    told = [c for c in _tool_messages(run_id) if "not repeated" in c]
    assert len(told) == 1, _tool_messages(run_id)
    # and the run, though it finished with a final answer, needs an operator's attention, naming that call (issue #13, 5)
    assert body["needs_attention"] is True, body
    [reason] = body["attention_reasons"]
    assert (reason["kind"], reason["tool"], reason["call_id"]) == ("outcome_unknown", "refund_order", row.call_id)
    assert reason["audit_id"] == row.pk
    assert RunEvent.objects.filter(run_id=run_id, type="run.needs_attention").count() == 1
    _assert_whole_trace(run_id)
    _assert_audit_joins_transcript(run_id)


def test_an_idempotent_write_cut_off_by_a_kill_is_repeated_with_the_same_key(
    stack: LiveStack | None, target: str, unblocked_db: None
) -> None:
    world = _refund_world(target, idempotent=True)
    run_id, body = _kill_during_the_call_and_resume(stack, world, "O202411280012")
    # then the call was sent again after the resume, with the same Idempotency-Key: the target applied it once
    requests = _requests_for("O202411280012")
    assert len(requests) == 2, "the request cut off by the kill, and the resumed step's replay"
    keys = {r["key"] for r in requests}
    assert len(keys) == 1 and keys != {""}, requests
    assert body["status"] == "finished" and body["terminal_reason"] == "final_answer", body
    # and the call's one audit row (the started row, completed) ends ok, with that key
    row = _the_one_audit_row(world, run_id)
    assert row.status == "ok", (row.status, row.error)
    assert row.idempotency_key == requests[0]["key"]
    assert not [c for c in _tool_messages(run_id) if "not repeated" in c]
    assert body["needs_attention"] is False and body["attention_reasons"] == [], "replayed with its key: nothing to check"
    _assert_whole_trace(run_id)
    _assert_audit_joins_transcript(run_id)

"""A tool call's timeout stops the work, not only the waiting (tools/bulkhead.py, cancel.py, isolation.py, http_exec.py).

A call past its timeout keeps its bulkhead slot until it really ends, and counts in
``agentops_tool_calls_overrunning`` meanwhile; a cooperative Python tool sees the cancel signal and
stops; a process-isolated one is killed; an HTTP request is closed at the deadline; and calls of
one hung tool can neither queue behind it forever nor take the threads of another tool.
(No database: the gateway runs read tools without one; its audit rows are only built here.)
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from audit.unit_of_work import StepAudit
from runtime.types import ToolCall, ToolContext, ToolOutcome, ToolStatus
from tests.support import hung_tools
from tools import bulkhead, isolation
from tools.executors import ExecContext
from tools.gateway import ToolGateway
from tools.models import Tool, ToolCategory, ToolKind
from tools.pyfunc import registry
from tools.serializers import config_problems

TENANT_ID = 4242


def _tool(name: str, *, kind: str, config: dict[str, Any], timeout: float, parameters: dict[str, Any] | None = None) -> Tool:
    return Tool(
        tenant_id=TENANT_ID, name=name, description="test", kind=kind, category=ToolCategory.READ, config=config,
        parameters=parameters or {"type": "object", "properties": {}}, timeout_seconds=timeout,
    )


def python_tool(key: str, *, timeout: float, **config: Any) -> Tool:
    name = f"{key.rsplit('.', 1)[-1]}_{uuid.uuid4().hex[:8]}"  # a bulkhead and a metric label of its own
    return _tool(name, kind=ToolKind.PYTHON, config={"function": key, **config}, timeout=timeout,
                 parameters=registry.get(key).schema)


def http_tool(url: str, *, timeout: float, config_timeout: float | None = None) -> Tool:
    name = f"http_{uuid.uuid4().hex[:8]}"
    config: dict[str, Any] = {"method": "GET", "url": url, "body": "none", "allow_hosts": ["127.0.0.1"]}
    if config_timeout is not None:
        config["timeout"] = config_timeout  # the request's own timeout, longer than the call's
    return _tool(name, kind=ToolKind.HTTP, config=config, timeout=timeout)


def call(tool: Tool, arguments: dict[str, Any], buffer: StepAudit | None = None) -> ToolOutcome:
    """One call through the gateway of a run that may use ``tool`` (a gateway per call, as per run)."""
    run = SimpleNamespace(
        pk=uuid.uuid4(), tenant_id=TENANT_ID, session_id=uuid.uuid4(), agent_id=1, version_id=1, created_by_id=None,
        api_key_id=None, version=SimpleNamespace(tools=[tool.name]),
    )
    gateway = ToolGateway(run=run, tools=[tool], audit=buffer if buffer is not None else StepAudit())
    return gateway.execute(ToolCall(f"c-{uuid.uuid4().hex[:6]}", tool.name, json.dumps(arguments)),
                           ToolContext(run_id=str(run.pk), step=1, span_id="s"))


def overrunning(tool: Tool) -> float:
    return REGISTRY.get_sample_value("agentops_tool_calls_overrunning", {"tool": tool.name}) or 0.0


def killed(tool: Tool) -> float:
    return REGISTRY.get_sample_value("agentops_tool_calls_killed_total", {"tool": tool.name}) or 0.0


def wait_until(predicate: Callable[[], bool], timeout: float = 3.0) -> bool:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def timed(fn: Callable[[], ToolOutcome]) -> tuple[ToolOutcome, float]:
    started = time.monotonic()
    outcome = fn()
    return outcome, time.monotonic() - started


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


# --------------------------------------------------------------------------- the bulkhead


def test_a_call_past_its_timeout_holds_its_slot_until_it_really_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulkhead, "BULKHEAD_SIZE", 2)
    tool, tag = python_tool("test_hung.hang", timeout=0.2), uuid.uuid4().hex
    try:
        # a call that ignores its timeout: the model hears of the timeout at once, the gauge counts the call meanwhile
        outcome, took = timed(lambda: call(tool, {"tag": tag, "seconds": 30}))
        assert outcome.status == ToolStatus.TIMEOUT and took < 0.6
        assert "No result was obtained" in outcome.content
        assert overrunning(tool) == 1
        outcome = call(tool, {"tag": tag, "seconds": 30})
        assert outcome.status == ToolStatus.TIMEOUT and overrunning(tool) == 2

        # both slots are held by calls past their timeout: the next call is refused at once, not queued behind them
        buffer = StepAudit()
        outcome, took = timed(lambda: call(tool, {"tag": tag, "seconds": 30}, buffer))
        assert took < 0.1
        assert outcome.status == ToolStatus.ERROR
        assert f"The tool {tool.name} is not answering" in outcome.content and "was not called" in outcome.content
        assert buffer[0].row.status == "error"
        stage = next(e for e in outcome.trace if e.get("stage") == "execute")
        assert stage["ok"] is False and stage["overrunning"] == 2
    finally:
        hung_tools.release(tag)

    # once the calls really end, their slots and the gauge are free again
    assert wait_until(lambda: overrunning(tool) == 0)
    assert call(tool, {"tag": tag, "seconds": 30}).status == ToolStatus.OK


def test_a_call_waits_for_a_slot_held_by_a_call_still_within_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulkhead, "BULKHEAD_SIZE", 1)
    tool, tag = python_tool("test_hung.hang", timeout=2.0), uuid.uuid4().hex
    first = threading.Thread(target=call, args=(tool, {"tag": tag, "seconds": 0.3}))
    first.start()
    time.sleep(0.05)
    try:
        outcome, took = timed(lambda: call(tool, {"tag": f"{tag}-2", "seconds": 0}))
        assert outcome.status == ToolStatus.OK and 0.15 < took < 1.5  # it waited for the first call, then ran
    finally:
        first.join(5)


def test_the_bulkheads_size_is_the_deployments_setting(settings: Any) -> None:
    """``TOOL_BULKHEAD_SIZE`` (default 4): a new tool's bulkhead holds that many calls; one more is refused when it
    may not wait."""
    assert bulkhead.size() == 4
    settings.TOOL_BULKHEAD_SIZE = 6
    key = f"0:sized-{uuid.uuid4().hex}"
    slots = [bulkhead.admit(key, label="sized", wait=0) for _ in range(6)]
    with pytest.raises(bulkhead.BulkheadFull) as full:
        bulkhead.admit(key, label="sized", wait=0)
    assert full.value.reason == "busy" and full.value.running == 6
    for slot in slots:
        slot.run(lambda: None).result(timeout=5)
    bulkhead.admit(key, label="sized", wait=1).run(lambda: None).result(timeout=5)  # the slots were handed back


def test_hung_calls_of_one_tool_cannot_take_the_threads_of_another() -> None:
    hung, other, tag = python_tool("test_hung.hang", timeout=0.2), python_tool("test_hung.hang", timeout=1.0), uuid.uuid4().hex
    callers = 20  # more than the 16 threads the gateway's shared pool had
    try:
        with ThreadPoolExecutor(max_workers=callers) as pool:
            started = time.monotonic()
            outcomes = list(pool.map(lambda _: call(hung, {"tag": tag, "seconds": 30}), range(callers)))
            took = time.monotonic() - started
        statuses = Counter(o.status for o in outcomes)
        # as many as the bulkhead holds time out and run on; the rest are refused once they are all overrunning
        assert statuses == {ToolStatus.TIMEOUT: bulkhead.size(), ToolStatus.ERROR: callers - bulkhead.size()}
        assert took < 1.0
        assert overrunning(hung) == bulkhead.size()

        # another tool still runs at once
        outcome, took = timed(lambda: call(other, {"tag": f"{tag}-other", "seconds": 0}))
        assert outcome.status == ToolStatus.OK and took < 0.3
    finally:
        hung_tools.release(tag)
    assert wait_until(lambda: overrunning(hung) == 0)


def test_worker_threads_are_reused_when_idle_started_when_busy_and_end_when_idle_long() -> None:
    workers, hold = bulkhead.Workers(idle_seconds=0.2), threading.Event()
    seen: list[threading.Thread] = []
    done = threading.Event()
    workers.submit(lambda: (seen.append(threading.current_thread()), done.set()))
    assert done.wait(1) and wait_until(lambda: workers._idle == 1, 1.0)
    done.clear()
    workers.submit(lambda: (seen.append(threading.current_thread()), done.set()))
    assert done.wait(1) and seen[0] == seen[1]  # the idle thread took the second task
    # a task that blocks does not make the next one wait: a new thread starts
    workers.submit(hold.wait)
    done.clear()
    workers.submit(lambda: (seen.append(threading.current_thread()), done.set()))
    assert done.wait(1)  # while the first task still blocks
    hold.set()
    assert wait_until(lambda: not any(t.is_alive() for t in seen), 2.0)  # idle too long: they ended


# --------------------------------------------------------------------------- Python tools


def test_a_cooperative_tool_sees_the_cancel_signal_at_the_timeout_and_stops() -> None:
    tool, tag = python_tool("test_hung.cooperative", timeout=0.3), uuid.uuid4().hex
    outcome, took = timed(lambda: call(tool, {"tag": tag, "seconds": 30}))
    assert outcome.status == ToolStatus.TIMEOUT and took < 0.8
    assert wait_until(lambda: tag in hung_tools.STOPPED, 1.0)
    seen = hung_tools.STOPPED[tag]
    assert seen["cancelled"] is True and 0.25 < seen["after"] < 0.6  # it stopped right at the timeout
    assert wait_until(lambda: overrunning(tool) == 0, 1.0)


def test_the_cancel_signal_is_the_executors_too() -> None:
    ctx = ExecContext(tenant_id=1, run=None, step=1, call_id="c", span_id="s")
    assert ctx.cancelled is False
    ctx.cancel.set()
    assert ctx.cancelled is True


@pytest.fixture(scope="module")
def fork_server() -> None:
    isolation.warm_up()  # the fork server sets Django up once (seconds); the calls below only fork


def test_a_process_isolated_tool_that_never_returns_is_killed_at_the_timeout(fork_server: None, tmp_path: Any) -> None:
    tool = python_tool("test_hung.spin", timeout=1.0, isolation="process")
    pid_file = tmp_path / "pid"
    buffer = StepAudit()
    outcome, took = timed(lambda: call(tool, {"pid_file": str(pid_file)}, buffer))
    assert outcome.status == ToolStatus.TIMEOUT and took < 1.8
    assert buffer[0].row.status == "timeout"

    pid = int(pid_file.read_text())
    assert pid != os.getpid()
    assert wait_until(lambda: not pid_alive(pid), 2.0), f"the tool's process {pid} is still running"
    assert wait_until(lambda: overrunning(tool) == 0, 2.0)
    assert killed(tool) == 1


def test_a_process_isolated_tool_runs_elsewhere_returns_its_result_and_may_not_use_the_database(fork_server: None) -> None:
    outcome = call(python_tool("test_hung.whoami", timeout=10, isolation="process"), {})
    assert outcome.status == ToolStatus.OK, outcome.content
    assert json.loads(outcome.content)["pid"] != os.getpid()

    outcome = call(python_tool("test_hung.use_database", timeout=10, isolation="process"), {})
    assert outcome.status == ToolStatus.ERROR
    assert "DatabaseForbidden: a process-isolated tool may not use the database" in outcome.content


def test_isolation_is_validated_with_the_tool_config() -> None:
    assert config_problems("python", {"function": "test_hung.spin", "isolation": "process"}, {}, tenant=None) == {}
    assert config_problems("python", {"function": "test_hung.spin", "isolation": "thread"}, {}, tenant=None) == {}
    wrong = config_problems("python", {"function": "test_hung.spin", "isolation": "fork"}, {}, tenant=None)
    assert wrong["isolation"][0].startswith('must be "thread" (the default')
    http = config_problems("http", {"url": "https://api.example.com/x", "isolation": "process"}, {}, tenant=None)
    assert http["isolation"] == ['only Python tools can run in a process of their own; remove "isolation"']


# --------------------------------------------------------------------------- HTTP tools


@dataclass
class SlowServer:
    """Accepts, reads the request, then sleeps or trickles; records when (``time.monotonic()``) it saw the client close."""

    port: int = 0
    closed_at: list[float] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def handle(self, conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                request += chunk
            path = request.split(b" ", 2)[1].decode()
            steps: list[tuple[float, bytes]]
            if path == "/sleep":  # answers after 10 s
                steps = [(10.0, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")]
            elif path == "/trickle-headers":  # a header byte every 50 ms, never done
                steps = [(0.0, b"HTTP/1.1 200 OK\r\nX-Pad: ")] + [(0.05, b"a")] * 200
            else:  # headers at once, then a body byte every 450 ms (each read well within the read timeout)
                steps = [(0.0, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")] + [(0.45, b"a")] * 22
            for delay, data in steps:
                readable, _, _ = select.select([conn], [], [], delay)
                try:
                    # a client that closes with our bytes still unread in its buffer sends a reset, not a FIN:
                    # recv then raises instead of returning b"" -- both mean the connection was closed
                    if readable and not conn.recv(1):
                        raise ConnectionResetError
                    conn.sendall(data)
                except OSError:
                    self.closed_at.append(time.monotonic())
                    return


@pytest.fixture
def slow_server() -> Iterator[SlowServer]:
    server = SlowServer()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    server.port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=server.handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server
    finally:
        listener.close()


@pytest.mark.parametrize(("path", "config_timeout"), [
    ("/sleep", None), ("/sleep", 5.0), ("/trickle-headers", None), ("/trickle-body", None),
])
def test_an_http_tool_ends_its_request_at_the_timeout(slow_server: SlowServer, path: str, config_timeout: float | None) -> None:
    tool = http_tool(f"{slow_server.base}{path}", timeout=0.5, config_timeout=config_timeout)
    buffer = StepAudit()
    started = time.monotonic()
    outcome = call(tool, {}, buffer)
    assert outcome.status == ToolStatus.TIMEOUT and time.monotonic() - started < 0.9
    assert buffer[0].row.status == "timeout"
    # the server saw the connection closed at about the timeout: the request did not run on behind the model's back
    assert wait_until(lambda: bool(slow_server.closed_at), 6.0), "the connection was never closed"
    assert slow_server.closed_at[0] - started < 0.5 + 0.2
    assert wait_until(lambda: overrunning(tool) == 0, 1.0)

"""Issue #13 item 10: the tool gateway's rate_limit stage (calls per minute per tenant per tool), without a database.

The gateway runs here on a stand-in run and unsaved Tool rows: a read tool's call needs no query, so every
call below goes through the real pipeline (resolve, authorize, validate, rate limit, execute, shape, audit)
and leaves its audit row in the buffer. The buckets are the model gateway's: in memory, or in Redis shared
by two gateways and by two processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import tests.support.tools  # noqa: F401 - registers test.slow
from audit.unit_of_work import StepAudit
from llm.ratelimit import LocalBucketStore, RedisBucketStore
from runtime.types import ToolCall, ToolContext, ToolOutcome, ToolStatus
from tools.gateway import ToolGateway
from tools.models import Tool, ToolCategory, ToolKind
from tools.pyfunc import registry, tool

ROOT = Path(__file__).resolve().parents[3]
#: Executions of the counting tool, per tenant: what really ran.
EXECUTED: Counter[int] = Counter()

if "test.rate.counted" not in registry:

    @tool(key="test.rate.counted", name="counted", category="read")
    def counted(tenant: int) -> dict[str, Any]:
        """Count a call (used to prove a limited call never runs)."""
        EXECUTED[tenant] += 1
        return {"calls": EXECUTED[tenant]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tool(tenant_id: int, limit: int | None, *, name: str = "counted", function: str = "test.rate.counted") -> Tool:
    return Tool(tenant_id=tenant_id, name=name, kind=ToolKind.PYTHON, category=ToolCategory.READ, config={"function": function},
                parameters=registry.get(function).schema, rate_limit_per_minute=limit, timeout_seconds=5)


def _gateway(tenant_id: int, tools: list[Tool], store: Any) -> tuple[ToolGateway, StepAudit]:
    run = SimpleNamespace(pk=uuid.uuid4(), tenant_id=tenant_id, agent_id=None, version_id=None, session_id=uuid.uuid4(),
                          created_by_id=None, api_key_id=None, version=SimpleNamespace(tools=[t.name for t in tools]))
    buffer = StepAudit()
    return ToolGateway(run=run, tools=tools, audit=buffer, bucket_store=store), buffer


def _call(gateway: ToolGateway, tenant_id: int, n: int, name: str = "counted") -> ToolOutcome:
    return gateway.execute(ToolCall(f"call_{n}", name, json.dumps({"tenant": tenant_id})), ToolContext("r", 1, "s"))


def _stage(outcome: ToolOutcome) -> dict[str, Any] | None:
    return next((e for e in outcome.trace if e.get("stage") == "rate_limit"), None)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    EXECUTED.clear()


def test_the_third_call_within_a_minute_is_audited_rate_limited_and_never_runs() -> None:
    clock = Clock()
    gateway, buffer = _gateway(7, [_tool(7, 2)], LocalBucketStore(clock))
    outcomes = [_call(gateway, 7, n) for n in range(3)]
    assert [o.status for o in outcomes] == [ToolStatus.OK, ToolStatus.OK, ToolStatus.RATE_LIMITED]
    assert EXECUTED[7] == 2, "the limited call never reached the tool"
    # the model reads why, and when it may try again (the bucket refills one call every 30 s)
    assert outcomes[2].content == ("Tool counted is limited to 2 calls per minute for this tenant; try again in ~30 seconds "
                                   "or continue without it.")
    # one audit row per call, the third rate_limited; the trace shows the stage, and no execute stage for it
    assert [w.row.status for w in buffer] == ["ok", "ok", "rate_limited"]
    assert buffer[2].row.error.startswith("Tool counted is limited") and buffer[2].started_pk is None
    assert _stage(outcomes[0]) == {"type": "tool.stage", "stage": "rate_limit", "ok": True, "limit_per_minute": 2}
    assert _stage(outcomes[2]) == {"type": "tool.stage", "stage": "rate_limit", "ok": False, "limit_per_minute": 2,
                                   "retry_in_seconds": 30}
    assert not [e for e in outcomes[2].trace if e.get("stage") in ("approval", "execute", "shape")]
    assert outcomes[2].trace[-1]["type"] == "tool.audit" and outcomes[2].trace[-1]["status"] == "rate_limited"
    # and the bucket refills: 30 s later one more call runs
    clock.now += 30
    assert _call(gateway, 7, 3).status == ToolStatus.OK and EXECUTED[7] == 3


def test_the_limit_is_per_tenant_and_per_tool_and_a_tool_without_one_never_touches_the_store() -> None:
    store = LocalBucketStore(Clock())
    first, _ = _gateway(1, [_tool(1, 1)], store)
    second, _ = _gateway(2, [_tool(2, 1)], store)
    assert _call(first, 1, 0).status == ToolStatus.OK
    assert _call(first, 1, 1).status == ToolStatus.RATE_LIMITED
    assert _call(second, 2, 0).status == ToolStatus.OK, "another tenant's bucket"
    message = _call(second, 2, 1).content
    assert "limited to 1 call per minute" in message and "~60 seconds" in message

    class Unreachable:
        def take(self, buckets: Any) -> Any:
            raise AssertionError("a tool without a limit must not take from a bucket")

    unlimited, _ = _gateway(1, [_tool(1, None, name="slow", function="test.slow")], Unreachable())
    free = unlimited.execute(ToolCall("c", "slow", '{"seconds": 0}'), ToolContext("r", 1, "s"))
    assert free.status == ToolStatus.OK and _stage(free) is None


def test_a_store_that_cannot_be_reached_refuses_the_call_with_an_error() -> None:
    class Down:
        def take(self, buckets: Any) -> Any:
            raise ConnectionError("redis is down")

    gateway, buffer = _gateway(3, [_tool(3, 5)], Down())
    outcome = _call(gateway, 3, 0)
    assert outcome.status == ToolStatus.ERROR and "rate limit could not be checked" in outcome.content
    assert EXECUTED[3] == 0 and [w.row.status for w in buffer] == ["error"]
    assert _stage(outcome) == {"type": "tool.stage", "stage": "rate_limit", "ok": False, "limit_per_minute": 5,
                               "reason": "the rate limit could not be checked (ConnectionError)"}


# -- shared through Redis: two gateways, and two worker processes ----------------------------------------------


def _redis_url() -> str:
    return os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"


@pytest.fixture
def redis_client() -> Iterator[Any]:
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(_redis_url())
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip(f"no Redis at {_redis_url()}")
    yield client
    client.close()


def test_two_gateways_share_one_redis_bucket(redis_client: Any) -> None:
    import redis

    prefix = f"test:tools:{uuid.uuid4().hex}:"
    tenant = 11
    # given two gateways as two worker processes would build them, each with its own Redis connection
    first, buffer1 = _gateway(tenant, [_tool(tenant, 2)], RedisBucketStore(redis.Redis.from_url(_redis_url()), prefix=prefix))
    second, buffer2 = _gateway(tenant, [_tool(tenant, 2)], RedisBucketStore(redis.Redis.from_url(_redis_url()), prefix=prefix))
    try:
        # when each makes calls of the tool, limited to 2 a minute for the tenant
        statuses = [_call(first, tenant, 0).status, _call(second, tenant, 1).status, _call(first, tenant, 2).status,
                    _call(second, tenant, 3).status]
        # then two ran in all, and the key is the (tenant, tool) bucket
        assert statuses == [ToolStatus.OK, ToolStatus.OK, ToolStatus.RATE_LIMITED, ToolStatus.RATE_LIMITED]
        assert EXECUTED[tenant] == 2
        assert [w.row.status for w in [*buffer1, *buffer2]] == ["ok", "rate_limited", "ok", "rate_limited"]
        assert redis_client.exists(f"{prefix}tool:{tenant}:counted:requests")
    finally:
        keys = list(redis_client.scan_iter(match=f"{prefix}*"))
        if keys:
            redis_client.delete(*keys)


CHILD = """
import json, sys, uuid, django
django.setup()
from types import SimpleNamespace
from runtime.types import ToolCall, ToolContext
import tests.support.tools  # registers test.slow
from audit.unit_of_work import StepAudit
from tools.gateway import ToolGateway
from tools.models import Tool
from tools.pyfunc import registry
tenant, name = int(sys.argv[1]), sys.argv[2]
row = Tool(tenant_id=tenant, name=name, kind="python", category="read", config={"function": "test.slow"},
           parameters=registry.get("test.slow").schema, rate_limit_per_minute=3, timeout_seconds=5)
run = SimpleNamespace(pk=uuid.uuid4(), tenant_id=tenant, agent_id=None, version_id=None, session_id=uuid.uuid4(),
                      created_by_id=None, api_key_id=None, version=SimpleNamespace(tools=[name]))
sys.stdin.readline()  # both processes start calling together
gateway = ToolGateway(run=run, tools=[row], audit=StepAudit())  # the process's own store: Redis, from REDIS_URL
print(json.dumps([gateway.execute(ToolCall(f"c{i}", name, '{"seconds": 0}'), ToolContext("r", 1, "s")).status.value
                  for i in range(3)]))
"""


def test_two_worker_processes_share_the_limit_through_redis(redis_client: Any) -> None:
    # given two processes configured as workers are (REDIS_URL), each with its own gateway and the default store
    tenant, name = 900_000_000 + uuid.uuid4().int % 99_999_999, f"shared_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "REDIS_URL": _redis_url(), "DJANGO_SETTINGS_MODULE": "config.settings"}
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(tenant), name], cwd=ROOT, env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    try:
        # when both call the tool (limited to 3 a minute for the tenant) three times at once
        outputs = [child.communicate("go\n", timeout=120) for child in children]
        for child, (_out, err) in zip(children, outputs, strict=True):
            assert child.returncode == 0, err[-3000:]
        statuses = Counter(s for out, _err in outputs for s in json.loads(out.strip().splitlines()[-1]))
        # then three calls ran across both processes and three were rate limited
        assert statuses == Counter({"ok": 3, "rate_limited": 3}), statuses
        assert redis_client.exists(f"agentops:ratelimit:tool:{tenant}:{name}:requests")
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
        redis_client.delete(f"agentops:ratelimit:tool:{tenant}:{name}:requests")

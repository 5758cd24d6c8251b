"""Issue #16: replays of runs recorded against a real OpenAI-compatible server (tests/support/fake_openai.py, reached
by the real openai SDK through the tenant's model gateway), with an HTTP write tool pointing at a local sink that
counts every request it gets: live mode, prompt changes, the cost cap, and write tools never called live."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from agents import services
from agents.models import AgentVersion, Run, RunEvent, Session
from audit.models import ToolCallAudit
from releases import services as releases
from releases.models import ReplayBatch, ReplayRun
from tenants.scoping import Actor, actor_for_user
from tests.factories import World
from tests.support.fake_openai import FakeOpenAI, call, text, tool_calls
from tests.support.provider_world import world_with_provider
from tests.support.recording_sink import RecordingSink
from tools.models import Tool, ToolCategory, ToolKind

pytestmark = pytest.mark.django_db

KEY = "sk-test-replay-key-0123456789abcdef"
PRICES = {"gpt-4o-mini": {"context_window": 128000, "price_in_per_1m": 0.15, "price_out_per_1m": 0.6}}
MODEL = "acme/gpt-4o-mini"
O1, O2 = "O202411280001", "O202411280002"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(api_key=KEY, models=["gpt-4o-mini"]) as server:
        yield server


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    with RecordingSink(body='{"noted": true}') as server:
        yield server


@pytest.fixture
def world(settings: Any, fake: FakeOpenAI, sink: RecordingSink) -> World:
    w = world_with_provider(settings, fake, api_key=KEY, models=PRICES, model=MODEL)
    Tool.objects.create(tenant=w.tenant, name="add_note", kind=ToolKind.HTTP, category=ToolCategory.WRITE, idempotent=False,
                        description="Add a note to an order.",
                        parameters={"type": "object", "properties": {"order_id": {"type": "string"}},
                                    "required": ["order_id"], "additionalProperties": False},
                        config={"method": "POST", "url": f"http://127.0.0.1:{sink.port}/notes/{{order_id}}",
                                "allow_hosts": ["127.0.0.1"]})
    w.version.tools = [*w.version.tools, "add_note"]
    w.version.save(update_fields=["tools"])
    return w


def _record(w: World, text_in: str, *script: Any, fake: FakeOpenAI) -> Run:
    fake.script(*script)
    run = services.start_run(actor=Actor(api_key=w.key), agent=w.agent, text=text_in)
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert run.status == "finished", (run.status, run.terminal_reason, run.error if hasattr(run, "error") else "")
    return run


def _version(w: World, number: int, **fields: Any) -> AgentVersion:
    base = {"model": MODEL, "system_prompt": w.version.system_prompt, "tools": w.version.tools, "policy": w.version.policy}
    return AgentVersion.objects.create(tenant=w.tenant, agent=w.agent, number=number, **{**base, **fields})


def _replay(w: World, candidate: AgentVersion, runs: list[Run], **options: Any) -> ReplayBatch:
    actor = actor_for_user(w.operator)
    evaluation_set = releases.create_evaluation_set(tenant=w.tenant, actor=actor, name=f"s{ReplayBatch.objects.count()}",
                                                    agent=w.agent, run_ids=[str(r.pk) for r in runs])
    batch = releases.start_replay(tenant=w.tenant, actor=actor, evaluation_set=evaluation_set, candidate=candidate,
                                  concurrency=1, **options)
    releases.run_shard(batch.pk, 0, 1)
    batch.refresh_from_db()
    return batch


def _counts() -> tuple[int, ...]:
    return (Run.objects.count(), RunEvent.objects.count(), ToolCallAudit.objects.count(), Session.objects.count())


def test_recorded_replay_of_model_and_write_tool_runs_is_exact_and_writes_nothing(world: World, fake: FakeOpenAI,
                                                                                    sink: RecordingSink) -> None:
    noted = _record(world, f"note order {O1}", tool_calls(call("add_note", {"order_id": O1})), text("Noted."), fake=fake)
    asked = _record(world, f"where is {O1}?", tool_calls(call("query_order", {"order_id": O1})),
                    text(f"Order {O1} has shipped."), fake=fake)
    assert len(sink.requests) == 1, "the recorded run wrote once"
    chats, before = len(fake.chat_requests), _counts()
    batch = _replay(world, world.version, [noted, asked], checks=[{"check": "no_diff"}])
    assert batch.status == "finished" and batch.pass_rate == 1.0 and batch.cost_spent == 0
    for row in ReplayRun.objects.filter(batch=batch):
        assert row.status == "replayed" and row.diff["changed"] == [] and row.live_tool_calls == 0, row.diff
    assert len(sink.requests) == 1, "a replay never writes"
    assert len(fake.chat_requests) == chats, "recorded mode calls no model"
    assert _counts() == before


def test_a_prompt_change_in_live_mode_gives_the_expected_diff_and_counts_its_cost(world: World, fake: FakeOpenAI) -> None:
    run = _record(world, f"where is {O1}?", tool_calls(call("query_order", {"order_id": O1})),
                  text(f"Order {O1} has shipped and arrives on Friday."), fake=fake)
    terse = _version(world, 2, system_prompt="Answer in one word.")
    fake.script(tool_calls(call("query_order", {"order_id": O1})), text("Shipped."))
    chats, runs = len(fake.chat_requests), Run.objects.count()
    batch = _replay(world, terse, [run], model_mode="live", cost_cap="1.00",
                    checks=[{"check": "same_tools"}, {"check": "answer_contains", "text": "Friday"}])
    assert len(fake.chat_requests) == chats + 2
    assert "Answer in one word." in str(fake.chat_requests[-1]["body"]["messages"][0])
    row = ReplayRun.objects.get(batch=batch)
    assert "answer" in row.diff["changed"] and "tools" not in row.diff["changed"], row.diff
    assert row.diff["tools"]["same"] and row.live_tool_calls == 0, "the read call was answered from the recording"
    assert f"-Order {O1} has shipped and arrives on Friday." in row.diff["answer"]["diff"]
    assert "+Shipped." in row.diff["answer"]["diff"]
    assert [c["passed"] for c in row.check_results] == [True, False] and row.regression
    assert batch.cost_spent > 0 and batch.cost_spent == row.cost and batch.pass_rate == 0.0
    assert Run.objects.count() == runs, "a live replay has no run row either"


def test_the_cost_cap_stops_the_remaining_runs_with_a_reason(world: World, fake: FakeOpenAI) -> None:
    runs = [_record(world, f"hello {i}", text(f"hi {i}"), fake=fake) for i in range(3)]
    fake.script(*[text("hello!", usage={"prompt_tokens": 1_000_000, "completion_tokens": 0}) for _ in range(3)])
    chats = len(fake.chat_requests)
    batch = _replay(world, _version(world, 2), runs, model_mode="live", cost_cap="0.10")
    assert len(fake.chat_requests) == chats + 1, "past the cap no model is called"
    assert batch.status == "finished" and batch.done == 3
    assert batch.cost_spent == Decimal("0.150000")
    rows = list(ReplayRun.objects.filter(batch=batch).order_by("position"))
    assert rows[0].status == "replayed"
    assert [r.status for r in rows[1:]] == ["skipped", "skipped"]
    assert all("cost cap" in r.error for r in rows[1:])
    report = releases.batch_report(batch)
    assert report["skipped"] == 2 and report["cost_spent"] == "0.150000"


@pytest.mark.parametrize("mode", ["recorded", "live"])
def test_a_write_tool_is_never_called_live_even_with_live_read(world: World, fake: FakeOpenAI, sink: RecordingSink,
                                                               mode: str) -> None:
    run = _record(world, f"note order {O1}", tool_calls(call("add_note", {"order_id": O1})), text("Noted."), fake=fake)
    assert len(sink.requests) == 1
    if mode == "live":  # the candidate's model asks for another write than the recording holds: a miss
        fake.script(tool_calls(call("add_note", {"order_id": O2})), text("Noted."))
        candidate = _version(world, 2, system_prompt="Note the other order.")
        batch = _replay(world, candidate, [run], model_mode="live", cost_cap="1.00", miss_policy="live_read")
    else:  # the recording's write outcome is gone from the cassette: the same call is a miss
        RunEvent.objects.filter(run=run, type="tool.call").delete()
        batch = _replay(world, world.version, [run], miss_policy="live_read")
    row = ReplayRun.objects.get(batch=batch)
    assert row.diff["terminal_reason"]["replayed"] == "replay_miss", row.diff
    assert any("add_note" in m and "never called live" in m for m in row.diff["misses"]), row.diff["misses"]
    assert row.live_tool_calls == 0 and row.passed is False
    assert len(sink.requests) == 1, "the sink got no request from the replay"

"""NUL characters from outside a run (a tool's answer, the model's reply) cannot be stored by PostgreSQL: text and
jsonb both refuse ``\\x00``. They are replaced by U+FFFD where the text enters a run, so the step commits and the run
finishes, on both databases, with the rest of the text kept. (Before, the step's one write failed and the run ended
as an internal error.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agents import services
from agents.models import Run, RunEvent, RunMessage
from audit.models import ToolCallAudit
from tenants.scoping import Actor
from tests.factories import World
from tests.support.fake_openai import FakeOpenAI, call, text, tool_calls
from tests.support.provider_world import world_with_provider
from tests.support.recording_sink import RecordingSink
from tools.models import Tool, ToolCategory, ToolKind

pytestmark = pytest.mark.django_db

KEY = "sk-test-nul-key-0123456789abcdef"
MODEL = "acme/gpt-4o-mini"
PRICES = {"gpt-4o-mini": {"context_window": 128000, "price_in_per_1m": 0.15, "price_out_per_1m": 0.6}}
NUL = "\x00"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(api_key=KEY, models=["gpt-4o-mini"]) as server:
        yield server


def _world(settings: Any, fake: FakeOpenAI, sink: RecordingSink) -> World:
    w = world_with_provider(settings, fake, api_key=KEY, models=PRICES, model=MODEL)
    Tool.objects.create(tenant=w.tenant, name="lookup", kind=ToolKind.HTTP, category=ToolCategory.READ,
                        description="Look an order up.",
                        parameters={"type": "object", "properties": {"order_id": {"type": "string"}},
                                    "required": ["order_id"]},
                        config={"method": "GET", "url": f"http://127.0.0.1:{sink.port}/orders/{{order_id}}",
                                "allow_hosts": ["127.0.0.1"]})
    w.version.tools = [*w.version.tools, "lookup"]
    w.version.save(update_fields=["tools"])
    return w


def _run(w: World) -> Run:
    run = services.start_run(actor=Actor(api_key=w.key), agent=w.agent, text="where is my order?")
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    return run


def _stored(run: Run) -> str:
    events = list(RunEvent.objects.filter(run=run).values_list("payload", flat=True))
    messages = list(RunMessage.objects.filter(run=run).values_list("message", flat=True))
    audit = list(ToolCallAudit.objects.filter(run_id=run.pk).values_list("arguments_summary", "error"))
    return json.dumps([events, messages, audit, run.output, run.error], ensure_ascii=False)


@pytest.mark.parametrize("body", [
    f"order O1 is in transit{NUL}, arriving Friday",                      # a text body with a raw NUL
    '{"status": "in transit\\u0000", "eta\\u0000": "Friday"}',            # JSON with escaped NULs in a value and a key
])
def test_a_tool_answer_with_nul_characters_is_kept_with_them_replaced(settings: Any, fake: FakeOpenAI, body: str) -> None:
    with RecordingSink(body=body) as sink:
        w = _world(settings, fake, sink)
        fake.script(tool_calls(call("lookup", {"order_id": "O1"})), text("It arrives Friday."))
        run = _run(w)
    assert run.status == "finished", (run.status, run.terminal_reason, run.error)
    stored = _stored(run)
    assert "arriving Friday" in stored or "Friday" in stored
    assert NUL not in stored and "\\u0000" not in stored
    assert "\ufffd" in stored
    # the model was told the answer, with the replacement character where the NUL was
    told = json.dumps(fake.chat_requests[-1]["body"]["messages"], ensure_ascii=False)
    assert "\ufffd" in told and "\\u0000" not in told


def test_a_tool_error_with_nul_characters_is_audited_with_them_replaced(settings: Any, fake: FakeOpenAI) -> None:
    with RecordingSink(status=500, body=f"backend down{NUL}{NUL} retry later") as sink:
        w = _world(settings, fake, sink)
        fake.script(tool_calls(call("lookup", {"order_id": "O1"})), text("The lookup failed."))
        run = _run(w)
    assert run.status == "finished", (run.status, run.terminal_reason, run.error)
    row = ToolCallAudit.objects.get(run_id=run.pk, tool_name="lookup")
    assert row.status == "error" and NUL not in row.error


def test_a_model_reply_and_arguments_with_nul_characters_are_kept_with_them_replaced(settings: Any, fake: FakeOpenAI) -> None:
    with RecordingSink(body='{"status": "shipped"}') as sink:
        w = _world(settings, fake, sink)
        fake.script(
            tool_calls(call("lookup", '{"order_id": "O1\\u0000"}'), content=f"Let me look{NUL}."),
            text(f"It has shipped{NUL}."),
        )
        run = _run(w)
        assert sink.requests and "%00" not in sink.requests[0][1] and NUL not in sink.requests[0][1]
    assert run.status == "finished", (run.status, run.terminal_reason, run.error)
    stored = _stored(run)
    assert NUL not in stored
    assert "shipped\ufffd." in stored and "look\ufffd." in stored
    # the arguments the tool got and the audit row hold the replacement; the model's raw argument text is kept as sent
    row = ToolCallAudit.objects.get(run_id=run.pk, tool_name="lookup")
    assert row.status == "ok" and "O1\ufffd" in json.dumps(row.arguments_summary, ensure_ascii=False)


def test_a_provider_error_with_nul_characters_ends_the_run_with_the_error_kept(settings: Any, fake: FakeOpenAI) -> None:
    from tests.support.fake_openai import error

    with RecordingSink(body='{"status": "shipped"}') as sink:
        w = _world(settings, fake, sink)
        fake.script(error(400, f"bad request{NUL}: the model refused"))
        run = _run(w)
    assert run.status in ("failed", "finished"), (run.status, run.terminal_reason, run.error)
    assert run.terminal_reason != "internal_error", run.error
    assert NUL not in _stored(run)

"""The walking skeleton end to end: API → worker → runtime → tool gateway → audit → websocket."""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

import pytest
from kombu import transport
from websockets.exceptions import InvalidStatus

from agents.models import RunEvent
from audit.models import ToolCallAudit
from config.health import healthz
from tests.factories import World, make_world
from tests.integration.wsclient import read_run_frames

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def worlds(live_stack: Any, django_db_blocker: Any) -> tuple[World, World]:
    with django_db_blocker.unblock():
        return make_world(), make_world()


def _start(live_stack: Any, key: str, text: str, **extra: Any) -> dict[str, Any]:
    with live_stack.client(key) as http:
        response = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": text, **extra})
    assert response.status_code == 202, response.text
    return response.json()


def test_a_run_started_through_the_api_finishes_with_an_answer(live_stack: Any, worlds: Any) -> None:
    # given tenant A's key; when it starts a run about an order
    world, _ = worlds
    body = _start(live_stack, world.raw_key, "where is order O202411280001?")
    # then the API accepted it with links, and a worker finished it with a real answer
    assert set(body) >= {"id", "status", "session", "links"}
    assert body["links"]["ws"].endswith(f"/ws/runs/{body['id']}/")
    run = live_stack.wait_for_run(world.raw_key, body["id"])
    assert run["terminal_reason"] == "final_answer", run
    assert "SF Express" in run["output"] or "SF1234567890" in run["output"], run["output"]


def test_the_trace_arrives_over_the_websocket_in_order_and_audit_rows_match_tool_calls(
    live_stack: Any, worlds: Any, unblocked_db: None
) -> None:
    world, _ = worlds
    body = _start(live_stack, world.raw_key, "what is in order O202411280002?")
    frames = read_run_frames(f"{live_stack.ws_url}/ws/runs/{body['id']}/", key=world.raw_key)
    seqs = [f["seq"] for f in frames]
    assert seqs == list(range(1, len(seqs) + 1)), "events must arrive in seq order with no gap or duplicate"
    assert frames[0]["type"] == "run.started"
    stored = list(RunEvent.objects.filter(run_id=body["id"]).order_by("seq").values_list("seq", "type"))
    assert [(f["seq"], f["type"]) for f in frames] == stored
    tool_calls = [f for f in frames if f["type"] == "tool.call"]
    assert tool_calls, "the demo agent calls at least one tool"
    audits = ToolCallAudit.objects.filter(run_id=body["id"])
    assert audits.count() == len(tool_calls)
    assert sorted(a.call_id for a in audits) == sorted(f["payload"]["call_id"] for f in tool_calls)
    assert all(a.status == "ok" for a in audits)


def test_resuming_the_websocket_after_a_seq_sends_only_later_events(live_stack: Any, worlds: Any) -> None:
    world, _ = worlds
    body = _start(live_stack, world.raw_key, "where is order O202411280001?")
    live_stack.wait_for_run(world.raw_key, body["id"])
    frames = read_run_frames(f"{live_stack.ws_url}/ws/runs/{body['id']}/?after=3", key=world.raw_key)
    assert frames[0]["seq"] == 4
    assert [f["seq"] for f in frames] == list(range(4, 4 + len(frames)))


def test_a_second_run_in_the_same_session_sees_the_history(live_stack: Any, worlds: Any) -> None:
    world, _ = worlds
    first = _start(live_stack, world.raw_key, "where is order O202411280001?")
    live_stack.wait_for_run(world.raw_key, first["id"])
    second = _start(live_stack, world.raw_key, "and order O202411280002?", session=first["session"])
    assert second["session"] == first["session"]
    run = live_stack.wait_for_run(world.raw_key, second["id"])
    assert run["terminal_reason"] == "final_answer"


def test_another_tenants_key_gets_404_over_the_api_and_is_refused_on_the_websocket(live_stack: Any, worlds: Any) -> None:
    world_a, world_b = worlds
    body = _start(live_stack, world_a.raw_key, "where is order O202411280001?")
    with live_stack.client(world_b.raw_key) as http:
        assert http.get(f"/api/v1/runs/{body['id']}").status_code == 404
        assert http.get(f"/api/v1/runs/{body['id']}/events").status_code == 404
        assert http.post(f"/api/v1/runs/{body['id']}/cancel").status_code == 404
        assert http.post("/api/v1/runs", json={"agent": "order-assistant", "input": "hi", "session": body["session"]}).status_code == 400
    with pytest.raises(InvalidStatus):
        read_run_frames(f"{live_stack.ws_url}/ws/runs/{body['id']}/", key=world_b.raw_key, timeout=5)
    with pytest.raises(InvalidStatus):
        read_run_frames(f"{live_stack.ws_url}/ws/runs/{body['id']}/", timeout=5)
    with pytest.raises(InvalidStatus):
        read_run_frames(f"{live_stack.ws_url}/ws/runs/{body['id']}/", key="aok_00000000_not-a-real-key", timeout=5)


def test_bad_request_bodies_get_400_with_field_errors(live_stack: Any, worlds: Any) -> None:
    world, _ = worlds
    with live_stack.client(world.raw_key) as http:
        missing = http.post("/api/v1/runs", json={})
        assert missing.status_code == 400
        assert set(missing.json()) >= {"agent", "input"}
        unknown = http.post("/api/v1/runs", json={"agent": "no-such-agent", "input": "hi"})
        assert unknown.status_code == 400 and "no-such-agent" in unknown.json()["agent"][0]
        bad_session = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": "hi", "session": "nope"})
        assert bad_session.status_code == 400 and "session" in bad_session.json()
        broken = http.post("/api/v1/runs", content=b'{"agent": ', headers={"Content-Type": "application/json"})
        assert broken.status_code == 400 and "JSON parse error" in broken.json()["detail"]
        bad_after = http.get(f"/api/v1/runs/{_start(live_stack, world.raw_key, 'hi')['id']}/events?after=-2")
        assert bad_after.status_code == 400 and "after" in bad_after.json()
    with live_stack.client() as anonymous:
        assert anonymous.post("/api/v1/runs", json={"agent": "order-assistant", "input": "hi"}).status_code in (401, 403)


def test_health_reports_each_dependency(live_stack: Any) -> None:
    with live_stack.client() as http:
        response = http.get("/healthz")
    body = response.json()
    assert response.status_code == 200
    assert body["mode"] == live_stack.mode
    assert set(body["checks"]) == {"database", "broker", "channel_layer", "workers"}
    assert all(check["ok"] for check in body["checks"].values())
    assert body["status"] == "ok"
    if live_stack.mode == "production":
        assert body["checks"]["workers"]["detail"].startswith(("1 of 1 expected seen", "2 of 1 expected seen")), body


def test_health_is_degraded_when_no_worker_serves_the_queue_and_unavailable_when_the_broker_transport_is_broken(
    live_stack: Any, settings: Any, monkeypatch: Any, rf: Any, unblocked_db: None
) -> None:
    if live_stack.mode != "production":
        body = json.loads(healthz(rf.get("/healthz")).content)
        assert body["checks"]["workers"]["detail"] == "in-process (embedded mode)"
        return
    # given a queue no worker listens on: the server still serves (200) but says runs would wait
    settings.CELERY_TASK_DEFAULT_QUEUE = f"agentops-nobody-{uuid.uuid4().hex[:6]}"
    response = healthz(rf.get("/healthz"))
    body = json.loads(response.content)
    assert response.status_code == 200 and body["status"] == "degraded", body
    assert "no worker seen" in body["checks"]["workers"]["detail"]
    # given the workers' own Redis transport cannot load (as when `packaging` was missing): 503, and the reason
    monkeypatch.setattr(transport, "_transport_cache", {})
    monkeypatch.delitem(sys.modules, "kombu.transport.redis")
    monkeypatch.setitem(sys.modules, "packaging.version", None)
    response = healthz(rf.get("/healthz"))
    body = json.loads(response.content)
    assert response.status_code == 503 and body["status"] == "unavailable"
    assert not body["checks"]["broker"]["ok"] and "packaging" in body["checks"]["broker"]["detail"], body


def test_a_browser_session_websocket_needs_an_allowed_origin(live_stack: Any, worlds: Any) -> None:
    world, _ = worlds
    body = _start(live_stack, world.raw_key, "where is order O202411280001?")
    live_stack.wait_for_run(world.raw_key, body["id"])
    with live_stack.client() as http:
        page = http.get("/admin/login/")
        token = page.cookies["csrftoken"]
        login = http.post("/admin/login/", data={"username": world.operator.username, "password": "correct-horse-battery",
                                                  "csrfmiddlewaretoken": token, "next": "/admin/"},
                          headers={"Referer": f"{live_stack.base_url}/admin/login/"})
        assert login.status_code == 302, login.text[:500]
        cookie = f"sessionid={http.cookies['sessionid']}"
    url = f"{live_stack.ws_url}/ws/runs/{body['id']}/"
    frames = read_run_frames(url, headers={"Cookie": cookie, "Origin": live_stack.base_url})
    assert frames[-1]["type"] == "run.finished"
    with pytest.raises(InvalidStatus):
        read_run_frames(url, headers={"Cookie": cookie, "Origin": "http://evil.example"}, timeout=5)

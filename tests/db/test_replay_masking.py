"""Issue #49 item 4: a replay's report masks the fields a tool declares sensitive, as the approval page does.

Recorded and replayed tool arguments are shown in ``GET /api/v1/replays/<id>``, on the console's replay page and in
the admin; a field the tool declares sensitive (``Tool.sensitive_fields``) is masked there for every role, and is
stored masked in the result's diff.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from accounts import services as tenant_services
from agents import model_clients, services
from agents.models import Run
from releases import services as releases
from releases.models import ReplayBatch, ReplayRun
from runtime.scripted import ScriptedModel, call, say
from tenants.models import Role
from tenants.scoping import Actor, actor_for_user
from tests.factories import World, make_user, make_world
from tests.support.clients import bearer_client
from tools.models import Tool

pytestmark = pytest.mark.django_db

#: The declared-sensitive value: only the tool call's arguments carry it (the answer does not repeat it).
ORDER = "O202411280001"


@pytest.fixture
def replayed(monkeypatch: pytest.MonkeyPatch) -> tuple[World, ReplayBatch]:
    world = make_world()
    Tool.objects.filter(tenant=world.tenant, name="query_order").update(sensitive_fields=["order_id"])
    model = ScriptedModel([call("query_order", {"order_id": ORDER}), say("Your parcel ships today.")])
    monkeypatch.setattr(model_clients, "model_client_for", lambda run: model)
    run = services.start_run(actor=Actor(api_key=world.key), agent=world.agent, text="where is my parcel?")
    services.execute_run(str(run.pk))
    assert Run.objects.get(pk=run.pk).terminal_reason == "final_answer"
    operator = actor_for_user(world.operator)
    chosen = releases.create_evaluation_set(tenant=world.tenant, actor=operator, name="parcels", agent=world.agent,
                                            run_ids=[run.pk])
    batch = releases.start_replay(tenant=world.tenant, actor=operator, evaluation_set=chosen, candidate=world.version,
                                  concurrency=1, checks=[{"check": "no_diff"}])
    releases.run_shard(batch.pk, 0, 1)
    batch.refresh_from_db()
    return world, batch


def _calls(diff: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(c["arguments"]) for side in ("recorded", "replayed") for c in diff["tools"][side]]


def test_declared_sensitive_arguments_are_masked_in_the_api_and_the_console_for_every_role(
        replayed: tuple[World, ReplayBatch]) -> None:
    world, batch = replayed
    row = ReplayRun.objects.get(batch=batch)
    assert row.status == "replayed" and row.passed, row.diff
    # the replay still compares the calls themselves: the same call, found in the recording
    assert row.diff["tools"]["same"] and len(row.diff["tools"]["replayed"]) == 1

    owner = make_user()
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    for role, user in ((Role.VIEWER, world.viewer), (Role.OPERATOR, world.operator), (Role.OWNER, owner)):
        _key, raw = tenant_services.create_api_key(tenant=world.tenant, name=f"k-{role}", owner=user, role=role, actor=None)
        report = bearer_client(raw).get(f"/api/v1/replays/{batch.pk}")
        assert report.status_code == 200
        assert ORDER not in report.content.decode(), f"the {role}'s report shows the declared-sensitive order id"
        assert {a["order_id"] for a in _calls(report.json()["results"][0]["diff"])} == {"******"}
        browser = Client()
        browser.force_login(user)
        page = browser.get(f"/console/replays/{batch.pk}/")
        assert page.status_code == 200 and ORDER not in page.content.decode(), f"the {role}'s console page shows it"
        assert "query_order" in page.content.decode()

    # at rest too: the stored diff holds the masked arguments
    assert ORDER not in json.dumps(row.diff)


def test_results_stored_before_the_masking_are_masked_when_shown(replayed: tuple[World, ReplayBatch]) -> None:
    world, batch = replayed
    row = ReplayRun.objects.get(batch=batch)
    raw = json.loads(json.dumps(row.diff))
    for side in ("recorded", "replayed"):
        for c in raw["tools"][side]:
            c["arguments"] = json.dumps({"order_id": ORDER})
    raw["misses"] = [f'query_order({{"order_id":"{ORDER}"}}): the replay\'s miss policy is stop']
    ReplayRun.objects.filter(pk=row.pk).update(diff=raw)  # as a row written before the fix holds it

    report = bearer_client(world.raw_key).get(f"/api/v1/replays/{batch.pk}")
    assert ORDER not in report.content.decode()
    admin = make_user(is_staff=True, is_superuser=True)
    browser = Client()
    browser.force_login(admin)
    page = browser.get(f"/admin/releases/replayrun/{row.pk}/change/")
    assert page.status_code == 200 and ORDER not in page.content.decode()

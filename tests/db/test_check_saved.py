"""``manage.py check_saved``: what today's save-time checks would refuse among the stored versions and tools (saved
before a check grew stricter) is listed with its tenant, name and reasons, nothing is changed, and the exit status
says whether there was any (marketplace/saved_checks.py)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from agents.models import AgentVersion, Run, Session
from marketplace.models import ReleaseWeight
from tests.db.test_flow_runs import ORDER, desk, make_flow, start
from tests.factories import World, make_world
from tools.models import Tool

pytestmark = pytest.mark.django_db

HUGE = "(a{10000}){10000}"  # refused at save since e47a036: its repeats multiply out to 10^8 elements


def check(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("check_saved", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def stale_flow(world: World) -> AgentVersion:
    """A flow version saved as today's checks allow, then changed as an older release allowed (bypassing the checks)."""
    agent = make_flow(world, desk())
    doc = desk()
    doc["input_schema"] = {"type": "object", "properties": {"order_id": {"type": "string", "pattern": HUGE}}}
    AgentVersion.objects.filter(pk=agent.current_version_id).update(definition=doc)
    return AgentVersion.objects.get(pk=agent.current_version_id)


def test_nothing_stale_exits_0() -> None:
    make_world()
    code, out = check()
    assert code == 0 and "passes today's checks" in out


def test_a_stale_flow_version_and_tool_are_listed_with_their_reasons_and_left_as_they_were() -> None:
    world = make_world()
    version = stale_flow(world)
    stored = AgentVersion.objects.get(pk=version.pk).definition
    tool = Tool.objects.filter(tenant=world.tenant).order_by("name").first()
    assert tool is not None
    Tool.objects.filter(pk=tool.pk).update(parameters={"type": "object", "properties": {"x": {"type": "string", "pattern": HUGE}}})
    code, out = check()
    assert code == 1
    assert f"{world.tenant.slug} · flow version desk v1 (live: new runs get it)" in out
    assert "too large a regular expression" in out and "input_schema" in out
    assert f"{world.tenant.slug} · tool {tool.name}" in out and "parameters:" in out and "properties/x/pattern" in out
    assert "2 stored item(s)" in out
    assert AgentVersion.objects.get(pk=version.pk).definition == stored  # read, never written
    # the run of that version is refused at its start, naming the version: what the command finds first
    refused = start(world, {"flow": "desk", "input": {"order_id": ORDER}})
    assert refused.status_code == 400 and "an operator must fix the flow's version" in refused.content.decode()


def test_a_used_version_is_marked_and_live_only_skips_versions_no_run_can_get() -> None:
    world = make_world()
    version = stale_flow(world)
    session = Session.objects.create(tenant=world.tenant, agent=version.agent)
    Run.objects.create(tenant=world.tenant, agent=version.agent, version=version, session=session, input="{}")
    code, out = check()
    assert code == 1 and "used by runs: make a new version" in out
    # a newer, valid version becomes current: the stale one is history, and --live-only leaves it out
    fixed = AgentVersion.objects.create(tenant=world.tenant, agent=version.agent, number=2, model="demo/planner",
                                        definition=desk())
    version.agent.current_version = fixed
    version.agent.save(update_fields=["current_version"])
    assert check("--live-only")[0] == 0
    code, out = check()
    assert code == 1 and "desk v1 (used by runs" in out and "live" not in out.split("desk v1")[1].split(")")[0]
    # a release weight above 0 makes it live again
    ReleaseWeight.objects.create(tenant=world.tenant, agent=version.agent, version=version, weight=10)
    code, out = check("--live-only")
    assert code == 1 and "desk v1 (live: new runs get it; used by runs" in out


def test_tenant_filter_json_output_and_an_unknown_tenant() -> None:
    mine, other = make_world(), make_world()
    stale_flow(mine)
    stale_flow(other)
    code, out = check("--tenant", mine.tenant.slug, "--json")
    document: dict[str, Any] = json.loads(out)
    assert code == 1 and [(p["tenant"], p["kind"], p["name"]) for p in document["problems"]] == [
        (mine.tenant.slug, "flow version", "desk v1")]
    assert "input_schema" in json.dumps(document["problems"][0]["errors"])
    assert len(json.loads(check("--json")[1])["problems"]) == 2
    with pytest.raises(CommandError, match="No tenant 'nobody'"):
        check("--tenant", "nobody")


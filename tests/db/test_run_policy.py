"""Issue #12: a run's policy is parsed once, with the tenant's tier table validated in it, and never edited after."""

from __future__ import annotations

import pytest

from agents import model_clients
from agents.engine import approval_overrides, build_loop
from agents.models import Run
from agents.run_policy import effective_document, policy_for
from runtime.config import PolicyError
from tests.e2e.builders import make_run
from tests.factories import make_world


def test_the_tenants_tier_table_fills_only_an_empty_one_and_the_version_document_is_untouched() -> None:
    version = {"limits": {"tiers": {"enabled": True}}}
    doc = effective_document(version, {"tiers": {"free": 2, "vip": 9}})
    assert doc["limits"]["tiers"]["table"] == {"free": 2, "vip": 9}
    assert version == {"limits": {"tiers": {"enabled": True}}}
    own = {"limits": {"tiers": {"enabled": True, "table": {"gold": 5}}}}
    assert effective_document(own, {"tiers": {"free": 2}})["limits"]["tiers"]["table"] == {"gold": 5}
    assert effective_document(None, {}) == {}


@pytest.mark.django_db
def test_a_run_parses_its_policy_once_and_everyone_reads_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    world.tenant.settings = {"tiers": {"free": 1, "vip": 7}}
    world.tenant.save()
    run = Run.objects.select_related("version", "tenant", "session", "agent").get(pk=make_run(world, status="queued").pk)
    calls = []
    real = policy_for.__globals__["parse_policy"]
    monkeypatch.setitem(policy_for.__globals__, "parse_policy", lambda *a, **k: calls.append(1) or real(*a, **k))
    build_loop(run, "token")
    model_clients._routing(run)
    approval_overrides(run)
    assert len(calls) == 1
    assert policy_for(run).policy.limits.tiers.table == {"free": 1, "vip": 7}


@pytest.mark.django_db
def test_a_broken_tenant_tier_table_is_refused_with_its_path() -> None:
    world = make_world()
    world.tenant.settings = {"tiers": {"free": "lots"}}
    world.tenant.save()
    run = Run.objects.select_related("version", "tenant").get(pk=make_run(world, status="queued").pk)
    with pytest.raises(PolicyError) as caught:
        policy_for(run)
    assert any("limits.tiers.table" in error for error in caught.value.errors), caught.value.errors

"""Issue 17 item 4: the demo planner carries a labelled demo price, so the demo shows money in embedded mode."""

from __future__ import annotations

import pytest
from django.test import Client

from agents import services
from agents.models import AgentVersion, Run, RunEvent, RunStatus
from llm.pricing import DEMO_PRICES, PriceTable, is_demo_price
from tenants.scoping import actor_for_api_key
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db(transaction=True)


def _finished_run(world: World, text: str = "What is the status of order O202411280001?") -> Run:
    run = services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text=text)
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    return run


def test_only_the_demo_planner_is_demo_priced() -> None:
    assert is_demo_price("demo/planner")
    assert not is_demo_price("openai/gpt-4o-mini") and not is_demo_price("demo/gpt-4o") and not is_demo_price("planner")
    assert PriceTable().cost("openai/gpt-4o-mini", 1000, 1000) == 0.0, "a real model is never priced by the demo table"
    assert DEMO_PRICES["planner"].price_in_per_1m > 0 and DEMO_PRICES["planner"].price_out_per_1m > 0


def test_a_demo_run_costs_money_in_the_trace_and_the_spend_view_labels_it_a_demo_price() -> None:
    from prometheus_client import REGISTRY

    def metric() -> float:
        return REGISTRY.get_sample_value("agentops_llm_cost_total", {"model": "demo/planner"}) or 0.0

    world = make_world()
    before = metric()
    run = _finished_run(world)
    assert (run.status, run.terminal_reason) == (RunStatus.FINISHED, "final_answer")
    assert metric() == pytest.approx(before + run.usage["cost"]), "the cost metric counts the demo price too"
    cost = run.usage["cost"]
    tokens_in, tokens_out = run.usage["input_tokens"], run.usage["output_tokens"]
    info = DEMO_PRICES["planner"]
    assert cost > 0 and cost == pytest.approx(tokens_in * info.price_in_per_1m / 1e6 + tokens_out * info.price_out_per_1m / 1e6)
    attempts = [e.payload for e in RunEvent.objects.filter(run=run, type="model.attempt")]
    assert attempts and all(a["priced"] and a["price"] == "demo price" and a["cost"] > 0 for a in attempts)

    client = Client()
    client.force_login(world.operator)
    response = client.get("/console/spend/?days=1")
    body = response.content.decode()
    report = response.context["spend"]
    assert report.total.cost == pytest.approx(cost) and report.total.cost_text != "0.0000"
    assert report.chart["metric"] == "cost"
    assert report.demo_priced and report.by_version[0]["demo_price"]
    assert 'id="demo-price-note"' in body and "not what any real model costs" in body


def test_a_cost_budget_stops_a_demo_run() -> None:
    world = make_world()
    version = world.version
    version.policy = {**version.policy, "budgets": {"run": {"cost": 0.0000001}}}
    version.save(update_fields=["policy"])
    run = _finished_run(world)
    assert run.terminal_reason == "budget_exceeded"


def test_the_label_follows_the_model_not_the_amount() -> None:
    world = make_world()
    _finished_run(world)
    client = Client()
    client.force_login(world.operator)
    assert 'id="demo-price-note"' in client.get("/console/spend/?days=1").content.decode()
    AgentVersion.objects.filter(pk=world.version.pk).update(model="openai/gpt-4o-mini")
    body = client.get("/console/spend/?days=1").content.decode()
    assert 'id="demo-price-note"' not in body and "demo price" not in body


def test_the_admins_run_list_labels_a_demo_cost() -> None:
    from django.contrib.auth import get_user_model

    world = make_world()
    run = _finished_run(world)
    admin = get_user_model().objects.create_superuser("root-demo-price", "root@example.com", "correct-horse-battery")
    client = Client()
    client.force_login(admin)
    body = client.get("/admin/agents/run/").content.decode()
    assert f"{run.usage['cost']:.4f}" in body and "demo price" in body and "not a real price" in body
    assert "demo price" in client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()

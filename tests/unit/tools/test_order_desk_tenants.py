"""Issue #49: the order-desk plugin's refunds are kept per tenant: one tenant neither sees nor uses up another's."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from audit.unit_of_work import StepAudit
from marketplace.builtin import order_desk
from runtime.types import ToolCall, ToolContext, ToolOutcome, ToolStatus
from tools import isolation
from tools.gateway import ToolGateway
from tools.models import Tool, ToolCategory, ToolKind
from tools.pyfunc import current_tenant, registry, tenant_scope

ORDER = "O202411280001"  # total 259.00


def _call(tenant_id: int, arguments: dict[str, Any], **config: Any) -> ToolOutcome:
    """One refund_order call through the gateway of a run of ``tenant_id``, as a run's step makes it."""
    tool = Tool(tenant_id=tenant_id, name=f"refund_{uuid.uuid4().hex[:8]}", description="test", kind=ToolKind.PYTHON,
                category=ToolCategory.READ, config={"function": "order_desk.refund_order", **config},
                parameters=registry.get("order_desk.refund_order").schema, timeout_seconds=20)
    run = SimpleNamespace(pk=uuid.uuid4(), tenant_id=tenant_id, session_id=uuid.uuid4(), agent_id=1, version_id=1,
                          created_by_id=None, api_key_id=None, version=SimpleNamespace(tools=[tool.name]))
    gateway = ToolGateway(run=run, tools=[tool], audit=StepAudit())
    return gateway.execute(ToolCall(f"c-{uuid.uuid4().hex[:6]}", tool.name, json.dumps(arguments)),
                           ToolContext(run_id=str(run.pk), step=1, span_id="s"))


def test_a_tenants_refunds_neither_show_in_nor_use_up_another_tenants() -> None:
    full = _call(1, {"order_id": ORDER, "amount": "259.00", "reason": "lost parcel"})
    assert full.status == ToolStatus.OK, full.content
    theirs = _call(2, {"order_id": ORDER, "amount": "30.00", "reason": "damaged cup"})
    assert theirs.status == ToolStatus.OK, theirs.content  # tenant 1's full refund does not use up tenant 2's order
    assert json.loads(theirs.content)["remaining_refundable"] == "229.00"
    refused = _call(2, {"order_id": ORDER, "amount": "250.00", "reason": "too much"})
    assert "at most 229.00" in refused.content and "already refunded 30.00" in refused.content
    assert "259.00 CNY more" not in refused.content and "lost parcel" not in refused.content
    again = _call(1, {"order_id": ORDER, "amount": "1.00", "reason": "once more"})
    assert "at most 0.00" in again.content  # tenant 1's own refunds still count for tenant 1
    assert [r["amount"] for r in order_desk.REFUNDS[1][ORDER]] == ["259.00"]
    assert [r["amount"] for r in order_desk.REFUNDS[2][ORDER]] == ["30.00"]
    assert json.dumps(order_desk.refunds_of(2)).count("refund_id") == 1 and order_desk.refunds_of(3) == {}
    order_desk.REFUNDS.clear()  # what tests/conftest.py does between tests: every tenant's refunds are gone
    assert order_desk.refunds_of(1) == {} and order_desk.refunds_of(2) == {}


def test_a_refund_outside_a_tenants_tool_call_is_refused() -> None:
    assert current_tenant() is None
    with pytest.raises(order_desk.RefundRefused, match="a tenant's tool call"):
        order_desk.refund_order(ORDER, "30.00", "no tenant")
    with tenant_scope(7):
        assert current_tenant() == 7 and order_desk.refund_order(ORDER, "30.00", "ok")["status"] == "refunded"
    assert current_tenant() is None and list(order_desk.REFUNDS) == [7]


def test_a_process_isolated_call_knows_its_tenant_too() -> None:
    isolation.warm_up()
    outcome = _call(5, {"order_id": ORDER, "amount": "30.00", "reason": "in a child"}, isolation="process")
    assert outcome.status == ToolStatus.OK, outcome.content
    assert json.loads(outcome.content)["remaining_refundable"] == "229.00"

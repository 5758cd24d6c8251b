"""The ``order-desk`` plugin's tools, backed by a small demo data set.

Descriptions say when to use a tool and when not to: the model (or the planner) reads them.
"""

from __future__ import annotations

import threading
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from marketplace.catalog import AgentPreset, PluginSpec, PluginTool
from tools.pyfunc import Param, current_tenant, tool

ORDER_ID = Param(description="The order number, e.g. O202411280001.", pattern=r"^O\d{12}$", examples=["O202411280001"])

ORDERS: dict[str, dict[str, Any]] = {
    "O202411280001": {
        "order_id": "O202411280001", "status": "shipped", "customer": "Li Wei", "total": "259.00", "currency": "CNY",
        "items": [{"sku": "TEA-01", "name": "Longjing tea 250g", "qty": 1, "price": "199.00"},
                  {"sku": "CUP-02", "name": "Glass cup", "qty": 2, "price": "30.00"}],
        "placed_at": "2024-11-28T09:12:00+08:00",
    },
    "O202411280002": {
        "order_id": "O202411280002", "status": "delivered", "customer": "Anna Schmidt", "total": "88.50", "currency": "CNY",
        "items": [{"sku": "BOOK-7", "name": "Notebook", "qty": 3, "price": "29.50"}],
        "placed_at": "2024-11-28T10:40:00+08:00",
    },
    "O202411280003": {
        "order_id": "O202411280003", "status": "processing", "customer": "Zhang Min", "total": "1299.00", "currency": "CNY",
        "items": [{"sku": "PHN-9", "name": "Phone case set", "qty": 1, "price": "1299.00"}],
        "placed_at": "2024-11-28T18:02:00+08:00",
    },
}

SHIPMENTS: dict[str, dict[str, Any]] = {
    "O202411280001": {
        "order_id": "O202411280001", "carrier": "SF Express", "tracking_no": "SF1234567890", "status": "in transit",
        "last_location": "Hangzhou sorting centre", "eta": "2024-11-30",
    },
    "O202411280002": {
        "order_id": "O202411280002", "carrier": "YTO", "tracking_no": "YT9876543210", "status": "delivered",
        "last_location": "Shanghai, Pudong", "eta": "2024-11-29",
    },
}


class NotFound(LookupError):
    pass


def _order(order_id: str) -> dict[str, Any]:
    try:
        return ORDERS[order_id]
    except KeyError:
        raise NotFound(f"No order {order_id} exists. Check the number with the user.") from None


@tool(key="order_desk.query_order", category="read")
def query_order(order_id: Annotated[str, ORDER_ID]) -> dict[str, Any]:
    """Look up an order: its status, items, total and when it was placed.

    Use it when the user asks about an order's status, contents or price. Do not use it for
    shipping progress (use query_logistics) or to change an order.
    """
    return dict(_order(order_id))


@tool(key="order_desk.query_logistics", category="read")
def query_logistics(order_id: Annotated[str, ORDER_ID]) -> dict[str, Any]:
    """Track an order's shipment: carrier, tracking number, where it is now and the expected delivery date.

    Use it when the user asks where an order is or when it arrives (物流, 快递, 到哪了). Do not use it for the
    order's contents or price (use query_order).
    """
    _order(order_id)
    shipment = SHIPMENTS.get(order_id)
    if shipment is None:
        return {"order_id": order_id, "status": "not shipped yet"}
    return dict(shipment)


@tool(key="order_desk.sum_order_totals", category="read")
def sum_order_totals(
    order_ids: Annotated[list[str], Param(description='Order numbers to add up, e.g. ["O202411280001", "O202411280002"].')],
) -> dict[str, Any]:
    """Add up the totals of several orders (合计, 总额).

    Use it when the user asks how much several orders cost together. Do not use it for a single
    order's price (use query_order).
    """
    total = sum((Decimal(_order(oid)["total"]) for oid in order_ids), Decimal("0"))
    return {"order_ids": order_ids, "total": f"{total:.2f}", "currency": "CNY", "count": len(order_ids)}


#: Refunds issued in this process (the demo's "payment system"): tenant id -> order -> refunds. Every tenant that
#: installed the plugin has its own book: one tenant's refunds neither show in another's answers nor use up its orders.
#: ``REFUNDS.clear()`` forgets every tenant's.
REFUNDS: dict[int, dict[str, list[dict[str, Any]]]] = {}
_refunds_lock = threading.Lock()
_REFUNDABLE = {"shipped", "delivered"}


class RefundRefused(ValueError):
    pass


def refunds_of(tenant_id: int) -> dict[str, list[dict[str, Any]]]:
    """A copy of one tenant's refunds, per order."""
    with _refunds_lock:
        return {order: [dict(r) for r in issued] for order, issued in REFUNDS.get(tenant_id, {}).items()}


@tool(key="order_desk.refund_order", category="write", idempotent=False)
def refund_order(
    order_id: Annotated[str, ORDER_ID],
    amount: Annotated[str, Param(description="The amount to refund in the order's currency, e.g. 30.00.",
                                 pattern=r"^\d+(\.\d{1,2})?$", examples=["30.00"])],
    reason: Annotated[str, Param(description="Why the customer gets the refund, in a few words.", min_length=3, max_length=200)],
) -> dict[str, Any]:
    """Refund money for an order (退款). This moves money: it needs a human's approval and must not be repeated.

    Use it only when the user explicitly asks for a refund of a shipped or delivered order and says how much.
    Do not use it to look up an order (use query_order) or to cancel an order that has not shipped.
    """
    tenant = current_tenant()
    if tenant is None:  # whose book would it go in? Never one shared by every tenant
        raise RefundRefused("refund_order runs only as a tenant's tool call; no refund was made.")
    order = _order(order_id)
    try:
        value = Decimal(amount)
    except InvalidOperation:
        raise RefundRefused(f"amount must be a number like 30.00, got {amount!r}.") from None
    if value <= 0:
        raise RefundRefused("amount must be more than 0.")
    if order["status"] not in _REFUNDABLE:
        raise RefundRefused(f"Order {order_id} is {order['status']}; only shipped or delivered orders can be refunded. "
                            "Offer to cancel it instead.")
    with _refunds_lock:
        issued = REFUNDS.setdefault(tenant, {}).setdefault(order_id, [])
        refunded = sum((Decimal(r["amount"]) for r in issued), Decimal("0"))
        remaining = Decimal(order["total"]) - refunded
        if value > remaining:
            raise RefundRefused(f"Order {order_id} can be refunded at most {remaining:.2f} {order['currency']} more "
                                f"(total {order['total']}, already refunded {refunded:.2f}).")
        refund = {"refund_id": f"R{order_id[1:]}{len(issued) + 1:02d}", "order_id": order_id, "amount": f"{value:.2f}",
                  "currency": order["currency"], "reason": reason, "status": "refunded"}
        issued.append(refund)
    return {**refund, "remaining_refundable": f"{remaining - value:.2f}"}


PLUGIN = PluginSpec(
    key="order-desk",
    name="Order desk",
    version="1.1.0",
    description="Answer questions about orders and shipments, add up order totals and refund orders (with approval).",
    tools=(
        PluginTool("order_desk.query_order"),
        PluginTool("order_desk.query_logistics"),
        PluginTool("order_desk.sum_order_totals"),
        PluginTool("order_desk.refund_order", requires_approval=True,
                   overrides={"required_scopes": ["orders:refund"], "sensitive_fields": ["reason"]}),
    ),
    presets=(
        AgentPreset(
            slug="order-desk-assistant",
            name="Order desk assistant",
            description="Answers order and shipping questions; refunds need an approver.",
            system_prompt=("You are the order desk of an online shop. Answer questions about orders with the tools; never "
                           "invent order data. If an order number is missing, ask for it. A refund needs the user's explicit "
                           "request and an approver's confirmation; say so."),
            model="demo/planner",
            tools=("query_order", "query_logistics", "sum_order_totals", "refund_order"),
            policy={"limits": {"max_recursion": 6}},
        ),
    ),
    scopes=("orders:read", "orders:refund"),
    config_schema={
        "type": "object",
        "properties": {
            "currency": {"type": "string", "enum": ["CNY", "EUR", "USD"], "default": "CNY",
                         "description": "The shop's currency."},
            "refund_limit": {"type": "number", "minimum": 0, "default": 500,
                             "description": "Refunds above this amount are refused by the approvers' policy."},
        },
        "additionalProperties": False,
    },
)

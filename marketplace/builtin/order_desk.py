"""The ``order-desk`` plugin's tools, backed by a small demo data set.

Descriptions say when to use a tool and when not to: the model (or the planner) reads them.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from tools.pyfunc import Param, tool

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

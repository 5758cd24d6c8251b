from __future__ import annotations

import json

from tools.shaping import apply_whitelist, render_summary, shape_result

ORDER = {
    "order_id": "O202411280001",
    "status": "refunded",
    "customer": {"name": "Li", "phone": "13812345678", "address": {"city": "Shanghai", "street": "X"}},
    "items": [{"sku": "A1", "qty": 1, "cost": 3}, {"sku": "B2", "qty": 2, "cost": 4}],
    "internal_notes": "do not show",
}


def test_whitelist_keeps_only_listed_fields() -> None:
    shaped = shape_result(
        ORDER,
        field_whitelist=["order_id", "customer.name", "customer.address.city", "items.sku"],
        size_cap=10_000,
        summary_template=None,
    )
    assert json.loads(shaped.content) == {
        "order_id": "O202411280001",
        "customer": {"name": "Li", "address": {"city": "Shanghai"}},
        "items": [{"sku": "A1"}, {"sku": "B2"}],
    }
    assert not shaped.truncated and shaped.missing_fields == []
    assert shaped.original_size == len(json.dumps(ORDER, ensure_ascii=False, separators=(",", ":")).encode())


def test_whitelist_on_list_results_and_missing_fields() -> None:
    data, missing = apply_whitelist([ORDER, {"order_id": "O2"}], ["order_id", "status", "refund_amount"])
    assert data == [{"order_id": "O202411280001", "status": "refunded"}, {"order_id": "O2"}]
    assert missing == ["refund_amount"]
    shaped = shape_result([ORDER], field_whitelist=["order_id", "refund_amount"], size_cap=1000, summary_template=None)
    assert shaped.content.splitlines()[0] == "refund_amount: not provided by the tool"
    assert shaped.missing_fields == ["refund_amount"]


def test_size_cap_truncates_with_marker() -> None:
    big = {"rows": [{"i": i, "text": "数据" * 10} for i in range(200)]}
    shaped = shape_result(big, field_whitelist=None, size_cap=500, summary_template=None)
    assert shaped.truncated
    assert len(shaped.content.encode("utf-8")) <= 500
    assert "…[truncated: showing " in shaped.content
    assert shaped.content.endswith(f" of {shaped.original_size} bytes]")
    shown = int(shaped.content.rsplit("showing ", 1)[1].split(" ")[0])
    serialised = json.dumps(big, ensure_ascii=False, separators=(",", ":")).encode()
    assert shaped.content.encode("utf-8").startswith(serialised[:shown])
    small = shape_result({"a": 1}, field_whitelist=None, size_cap=500, summary_template=None)
    assert small.content == '{"a":1}' and not small.truncated


def test_summary_template_states_missing_fields() -> None:
    shaped = shape_result(
        ORDER,
        field_whitelist=["order_id", "status", "customer.name", "refund_amount"],
        size_cap=2000,
        summary_template="Order {order_id} for {customer.name} is {status}; refund amount {refund_amount:.2f}.",
    )
    lines = shaped.content.splitlines()
    assert lines[0] == "Order O202411280001 for Li is refunded; refund amount [not provided by the tool]."
    assert lines[1] == "refund_amount: not provided by the tool"
    assert json.loads(lines[2])["order_id"] == "O202411280001"
    assert shaped.missing_fields == ["refund_amount"]


def test_summary_template_formats_and_null_values() -> None:
    text, missing = render_summary("Refund {amount:.2f} on {date}", {"amount": 12.5, "date": None})
    assert text == "Refund 12.50 on [not provided by the tool]"
    assert missing == ["date"]
    text, missing = render_summary("{count} orders; first is {first.order_id}", [ORDER, ORDER])
    assert text == "2 orders; first is O202411280001" and missing == []
    shaped = shape_result(ORDER, field_whitelist=None, size_cap=100, summary_template="{status}", include_data=False)
    assert shaped.content == "refunded"
    broken, _ = render_summary("{unclosed", {})
    assert broken.startswith("(summary template error")


def test_text_results_pass_through() -> None:
    assert shape_result("plain text", field_whitelist=None, size_cap=100, summary_template=None).content == "plain text"
    shaped = shape_result('{"a": 1, "b": 2}', field_whitelist=["a"], size_cap=100, summary_template=None)
    assert json.loads(shaped.content) == {"a": 1}


def test_a_summary_templates_width_or_precision_past_the_bound_is_ignored() -> None:
    """A tenant's template such as {count:>999999999} made a gigabyte string on every call of the tool."""
    assert render_summary("{count:0>5} rows", [1, 2]) == ("00002 rows", [])
    assert render_summary("{count:>200}", [1, 2])[0] == " " * 199 + "2"
    for template in ("{count:>999999999}", "{count:>201}", "{first:.999999999f}", "{count:>{first}}",
                     "{count:>" + "9" * 5000 + "}"):
        text, _ = render_summary(template, [1_000_000_000, 2])
        assert len(text) <= 20, (template, len(text))

"""Offline token counting (runtime/tokens.py)."""

from __future__ import annotations

import pytest

from runtime.tokens import PER_MESSAGE_OVERHEAD, count_messages, count_tokens

MESSAGES = [
    {"role": "system", "content": "You are a refund desk. 你好，世界。"},
    {"role": "user", "content": "Refund order O202411280001, please."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"order_id": "O202411280001"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"status": "paid", "amount": 120}'},
    {"role": "assistant", "content": "Checking the logistics too.", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "logistics", "arguments": "{}"}}]},
    {"role": "user", "content": ""},
    {"role": "user", "content": [{"type": "text", "text": "parts"}]},
]


@pytest.mark.parametrize("model", ["demo/planner", "openai/gpt-4o", ""])
def test_a_conversation_counts_each_message_s_text_and_its_calls_plus_the_per_message_overhead(model: str) -> None:
    texts = [
        "You are a refund desk. 你好，世界。",
        "Refund order O202411280001, please.",
        'lookup_order\n{"order_id": "O202411280001"}',
        '{"status": "paid", "amount": 120}',
        "Checking the logistics too.\nlogistics\n{}",
        "",
        "[{'type': 'text', 'text': 'parts'}]",
    ]
    expected = sum(PER_MESSAGE_OVERHEAD + count_tokens(text, model) for text in texts)
    assert count_messages(MESSAGES, model) == expected
    assert count_messages([], model) == 0
    assert count_messages(MESSAGES[:1], model) == PER_MESSAGE_OVERHEAD + count_tokens(texts[0], model) > PER_MESSAGE_OVERHEAD


def test_count_specs_counts_what_count_tools_counts_and_makes_each_specs_json_once() -> None:
    from runtime.tokens import count_specs, count_tools
    from runtime.types import ToolSpec

    specs = [ToolSpec("lookup_order", "查询订单 (an order's status)", {"type": "object", "properties": {"id": {"type": "string"}}}),
             ToolSpec("refund", "Refund an order", {"type": "object", "properties": {"amount": {"type": "number"}}})]
    for model in ("", "gpt-4o-mini"):
        assert count_specs(specs, model) == count_tools([s.to_openai() for s in specs], model)
        assert count_specs(specs[:1], model) == count_tools([specs[0].to_openai()], model)
    assert count_specs([], "gpt-4o-mini") == 0
    made = specs[0].openai_json
    assert specs[0].openai_json is made  # remembered on the spec, not made again per count

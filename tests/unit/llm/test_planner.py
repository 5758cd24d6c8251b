from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from llm.planner import DeterministicPlanner
from runtime.types import ModelRequest, ToolSpec

A, B, C = "O202411280001", "O202411280002", "O202411280003"


def plan(text: str | list[dict[str, Any]], tools: list[ToolSpec], clock: datetime, **kw: Any):
    messages = [{"role": "user", "content": text}] if isinstance(text, str) else text
    planner = DeterministicPlanner(clock=lambda: clock)
    return planner.complete(ModelRequest("demo/planner", messages, tools, **kw))


def calls_of(response) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in response.tool_calls]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("where is order O202411280001?", [("query_logistics", {"order_id": A})]),
        ("订单O202411280001到哪了", [("query_logistics", {"order_id": A})]),
        ("show order O202411280001", [("query_order", {"order_id": A})]),
        ("查询订单O202411280001的状态", [("query_order", {"order_id": A})]),
        ("refund order O202411280001", [("refund_order", {"order_id": A})]),
        ("帮我退款订单 O202411280001", [("refund_order", {"order_id": A})]),
        (
            "refund order O202411280001 because it arrived broken",
            [("refund_order", {"order_id": A, "reason": "it arrived broken"})],
        ),
        ("sum the totals of O202411280001 and O202411280002", [("sum_order_totals", {"order_ids": [A, B]})]),
        (
            "what's the total of orders O202411280001, O202411280002 and O202411280003",
            [("sum_order_totals", {"order_ids": [A, B, C]})],
        ),
        ("订单 O202411280001 和 O202411280002 一共多少钱", [("sum_order_totals", {"order_ids": [A, B]})]),
        (
            "refund order O202411280001 and track its shipment",
            [("query_logistics", {"order_id": A}), ("refund_order", {"order_id": A})],
        ),
        (
            "search flights from Shanghai to Beijing tomorrow",
            [("search_flights", {"origin": "Shanghai", "destination": "Beijing", "date": "2024-11-28"})],
        ),
        (
            "search flights from New York to San Francisco on Nov 30",
            [("search_flights", {"origin": "New York", "destination": "San Francisco", "date": "2024-11-30"})],
        ),
        (
            "查一下明天从上海到北京的航班",
            [("search_flights", {"origin": "上海", "destination": "北京", "date": "2024-11-28"})],
        ),
        (
            "11月29日 上海到广州的航班",
            [("search_flights", {"origin": "上海", "destination": "广州", "date": "2024-11-29"})],
        ),
        (
            "flights from PVG to PEK on 2024-12-01",
            [("search_flights", {"origin": "PVG", "destination": "PEK", "date": "2024-12-01"})],
        ),
        (
            "rebook booking ABC123 to flight MU5101",
            [("rebook_flight", {"booking_ref": "ABC123", "flight_no": "MU5101"})],
        ),
        ("帮我把预订 XK9Q21 改签到 CA1234", [("rebook_flight", {"booking_ref": "XK9Q21", "flight_no": "CA1234"})]),
    ],
)
def test_requests_become_tool_calls(text: str, expected: list, tools: list[ToolSpec], clock: datetime) -> None:
    response = plan(text, tools, clock)

    assert calls_of(response) == expected
    assert response.finish_reason == "tool_calls"
    assert [c.id for c in response.tool_calls] == [f"call_1_{i}" for i in range(len(expected))]
    [entry] = response.trace
    assert entry["type"] == "planner.plan"
    assert [c["name"] for c in entry["calls"]] == [name for name, _ in expected]
    assert entry["scores"][expected[0][0]] > 0


def test_call_ids_follow_the_loop_step(tools: list[ToolSpec], clock: datetime) -> None:
    response = plan("refund order O202411280001", tools, clock, metadata={"step": 4})
    assert [c.id for c in response.tool_calls] == ["call_4_0"]


def test_a_missing_required_argument_is_asked_for_not_guessed(tools: list[ToolSpec], clock: datetime) -> None:
    response = plan("please refund my order", tools, clock)

    assert response.tool_calls == []
    assert "order_id" in (response.content or "")
    assert response.trace[0]["missing"] == [{"tool": "refund_order", "fields": ["order_id"]}]
    assert response.trace[0]["phase"] == "clarify"


def test_missing_argument_is_asked_in_chinese(tools: list[ToolSpec], clock: datetime) -> None:
    response = plan("我要退款", tools, clock)
    assert response.tool_calls == []
    assert "还需要您提供" in (response.content or "") and "order_id" in (response.content or "")


def test_a_follow_up_supplies_the_missing_field(tools: list[ToolSpec], clock: datetime) -> None:
    conversation = [
        {"role": "user", "content": "please refund my order"},
        {"role": "assistant", "content": "To run refund_order I need the order_id."},
        {"role": "user", "content": "O202411280001"},
    ]
    assert calls_of(plan(conversation, tools, clock)) == [("refund_order", {"order_id": A})]


def test_no_match_lists_what_it_can_do(tools: list[ToolSpec], clock: datetime) -> None:
    response = plan("tell me a joke about penguins", tools, clock)
    assert response.tool_calls == []
    for tool in tools:
        assert tool.name in (response.content or "")
    assert response.trace[0]["phase"] == "no_match"

    chinese = plan("给我讲个笑话", tools, clock)
    assert "我可以帮您" in (chinese.content or "")


def test_without_tools_it_says_it_cannot_act(clock: datetime) -> None:
    response = plan("refund order O202411280001", [], clock)
    assert response.tool_calls == [] and "no tools" in (response.content or "")


def _after_results(user: str, name: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    call = {"id": "call_1_0", "type": "function", "function": {"name": name, "arguments": json.dumps({"order_id": A})}}
    return [
        {"role": "user", "content": user},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": json.dumps(result, ensure_ascii=False)},
    ]


def test_final_answer_summarises_tool_results(tools: list[ToolSpec], clock: datetime) -> None:
    result = {"order_id": A, "carrier": "SF Express", "status": "in_transit", "eta": "2024-11-29"}
    response = plan(_after_results("where is order O202411280001?", "query_logistics", result), tools, clock)

    assert response.tool_calls == []
    assert response.finish_reason == "stop"
    content = response.content or ""
    assert content.startswith("Here is what I found")
    for value in ("query_logistics", "SF Express", "in_transit", "2024-11-29"):
        assert value in content
    assert response.trace[0]["phase"] == "answer"


def test_final_answer_is_in_chinese_when_the_user_wrote_chinese(tools: list[ToolSpec], clock: datetime) -> None:
    result = {"order_id": A, "status": "已发货", "location": "上海转运中心"}
    response = plan(_after_results("订单O202411280001到哪了", "query_logistics", result), tools, clock)
    content = response.content or ""
    assert content.startswith("查询结果如下")
    assert "上海转运中心" in content and "已发货" in content


def test_usage_is_counted_offline_and_costs_nothing(tools: list[ToolSpec], clock: datetime) -> None:
    response = plan("refund order O202411280001", tools, clock)
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.usage.cost == 0.0


def test_schema_keywords_and_enums(clock: datetime) -> None:
    weather = ToolSpec(
        "get_forecast",
        "Forecast for a city. Keywords: 下雨, umbrella",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Shanghai", "Beijing"]},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "x-keywords": ["带伞"],
        },
    )
    other = ToolSpec("refund_order", "Refund an order.", {"type": "object", "properties": {}})
    assert calls_of(plan("do I need an umbrella in beijing for 3 days, in fahrenheit", [weather, other], clock)) == [
        ("get_forecast", {"city": "Beijing", "days": 3, "unit": "fahrenheit"})
    ]
    assert calls_of(plan("明天Shanghai要带伞吗", [weather, other], clock)) == [("get_forecast", {"city": "Shanghai"})]


def test_summarize_task_condenses_the_conversation(tools: list[ToolSpec], clock: datetime) -> None:
    messages = _after_results("where is order O202411280001?", "query_logistics", {"status": "in_transit"})
    response = plan(messages, tools, clock, task="summarize")
    assert response.tool_calls == []
    assert "where is order" in (response.content or "") and "in_transit" in (response.content or "")


def test_a_tools_keywords_follow_its_current_description_and_keywords_not_a_stale_copy() -> None:
    from llm.intent import score_tools

    plain = ToolSpec("lookup", "Look something up.", {"type": "object"})
    described = ToolSpec("lookup", "Look up the weather forecast.", {"type": "object"})
    listed = ToolSpec("lookup", "Look something up.", {"type": "object", "x-keywords": ["forecast"]})
    for _ in range(2):  # the second round is served from the keyword cache
        assert [s.score > 0 for s in score_tools("what is the forecast", [plain, described, listed])] == [False, True, True]
    first, second = score_tools("forecast", [listed]), score_tools("forecast", [listed])
    assert first == second and first[0].matched == ("weather",)  # "forecast" is a word of the weather concept


def test_a_huge_tool_description_is_scored_but_never_kept_in_the_keyword_cache() -> None:
    """A description is a tenant's input: one of megabytes is worked out on each call, not held by the process."""
    from llm import intent

    huge = ToolSpec("lookup", "Look up the weather forecast. " + "padding " * 20_000, {"type": "object"})
    before = intent._keywords.cache_info().currsize, intent._groups.cache_info().currsize
    assert intent.score_tools("what is the forecast", [huge])[0].score > 0
    assert (intent._keywords.cache_info().currsize, intent._groups.cache_info().currsize) == before
    intent.score_tools("anything", [ToolSpec("a", "short", {"type": "object"})])  # "short" is in the caches now
    sizes = intent._expand_cached.cache_info().currsize, intent._normal_cached.cache_info().currsize
    intent.score_tools("anything", [ToolSpec("x" * 5_000, "short", {"type": "object"})])
    assert (intent._expand_cached.cache_info().currsize, intent._normal_cached.cache_info().currsize) == sizes, \
        "a 5,000-character word is not kept either"


def test_a_tools_keyword_groups_are_worked_out_once_and_match_as_its_keywords_do() -> None:
    """``score_tools`` scores by the tool's cached groups: the same groups, weights and words (in order) as grouping
    ``tool_keywords`` on each call did; a second scoring of the same tool reads the cache."""
    from llm import intent

    tool = ToolSpec("query_logistics", "Track a parcel. Keywords: shipment, 物流", {"type": "object"})
    expected: dict[str, tuple[float, list[str]]] = {}
    for kw in intent.tool_keywords(tool):
        weight, words = expected.get(kw.group, (0.0, []))
        expected[kw.group] = (max(weight, kw.weight), [*words, kw.text])
    assert intent.tool_groups(tool) == tuple((g, w, tuple(ws)) for g, (w, ws) in expected.items())
    hits = intent._groups.cache_info().hits
    assert intent.score_tools("where is my shipment", [tool])[0].score > 0
    assert intent._groups.cache_info().hits == hits + 1


def test_dates_are_found_once_per_message_and_a_caller_cannot_change_what_is_kept() -> None:
    """The planner extracts every scored tool's arguments from one message: its dates are found once. What a caller
    gets is its own list; a message longer than the cache's bound is worked out and not kept."""
    from datetime import date

    from llm import extract

    today = date(2026, 12, 7)
    first = extract.find_dates("ship it on 2026-12-24 or next monday", today)
    assert first == [("2026-12-24", (11, 22)), ("2026-12-14", (25, 36))]
    first.clear()
    assert extract.find_dates("ship it on 2026-12-24 or next monday", today) == [("2026-12-24", (11, 22)),
                                                                               ("2026-12-14", (25, 36))]
    size = extract._dates.cache_info().currsize
    assert extract.find_dates("x " * 3000 + "on 2026-01-02", today) == [("2026-01-02", (6003, 6013))]
    assert extract._dates.cache_info().currsize == size

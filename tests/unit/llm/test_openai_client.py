"""The real openai SDK against the local fake server."""

from __future__ import annotations

import json

import httpx
import pytest

from llm.config import ModelInfo, ProviderConfig
from llm.errors import (
    MalformedResponseError,
    ProviderAuthError,
    ProviderConnectionError,
    ProviderRateLimitedError,
    ProviderServerError,
    ProviderTimeoutError,
    UnknownModelError,
)
from llm.openai_client import OpenAICompatibleClient
from runtime.types import ModelRequest, ToolSpec
from tests.support.fake_openai import (
    FakeOpenAI,
    call,
    hang,
    no_choices,
    not_json,
    rate_limited,
    server_error,
    text,
    tool_calls,
)

KEY = "sk-fake-provider-key-0123456789"


def provider(server: FakeOpenAI, **kw) -> ProviderConfig:
    settings = {"base_url": server.base_url, "api_key": KEY, "timeout": 5.0, "models": {"small": ModelInfo()}}
    return ProviderConfig("acme", **{**settings, **kw})


def ask(text_: str, tools: list[ToolSpec], model: str = "acme/small") -> ModelRequest:
    return ModelRequest(model, [{"role": "system", "content": "You help."}, {"role": "user", "content": text_}], tools)


def test_a_run_like_exchange_with_tool_calls_completes(fake: FakeOpenAI, tools: list[ToolSpec]) -> None:
    # given a provider that answers like the planner (the fake's "planner" behaviour)
    fake.set_default({"kind": "planner"})
    client = OpenAICompatibleClient(provider(fake))
    request = ask("where is order O202411280001?", tools)

    # when the model asks for a tool, the result goes back, and the model is asked again
    first = client.complete(request)
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [("query_logistics", {"order_id": "O202411280001"})]
    request.messages.append(first.as_message())
    for c in first.tool_calls:
        result = {"status": "in_transit", "carrier": "SF Express"}
        request.messages.append({"role": "tool", "tool_call_id": c.id, "name": c.name, "content": json.dumps(result)})
    final = client.complete(request)

    # then the final answer summarises the result, and every call was recorded with usage
    assert final.tool_calls == [] and "SF Express" in (final.content or "")
    assert final.model == "acme/small" and final.usage.input_tokens > 0
    bodies = [r["body"] for r in fake.chat_requests]
    assert bodies[0]["model"] == "small" and bodies[0]["tools"][0]["type"] == "function"
    assert "name" not in bodies[1]["messages"][-1], "the runtime-only 'name' key is not sent to the provider"
    assert fake.chat_requests[0]["headers"]["authorization"] == f"Bearer {KEY}"


def test_parallel_tool_calls_and_raw_malformed_arguments(fake: FakeOpenAI, tools: list[ToolSpec]) -> None:
    fake.script(tool_calls(call("query_order", {"order_id": "O1"}), call("query_logistics", '{"order_id": "O1"')))
    response = OpenAICompatibleClient(provider(fake)).complete(ask("x", tools))

    assert [c.name for c in response.tool_calls] == ["query_order", "query_logistics"]
    assert response.tool_calls[1].arguments == '{"order_id": "O1"', "broken JSON is passed through for repair"
    assert response.finish_reason == "tool_calls"
    assert fake.chat_requests[0]["body"]["parallel_tool_calls"] is True


def test_streaming_assembles_tool_call_deltas_and_reads_usage(fake: FakeOpenAI, tools: list[ToolSpec]) -> None:
    fake.script(
        tool_calls(
            call("query_order", {"order_id": "O202411280001"}),
            call("refund_order", {"order_id": "O202411280002", "reason": "damaged"}),
            content="Checking both.",
            usage={"prompt_tokens": 321, "completion_tokens": 45},
        )
    )
    response = OpenAICompatibleClient(provider(fake), stream=True).complete(ask("x", tools))

    assert response.content == "Checking both."
    assert [(c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("query_order", {"order_id": "O202411280001"}),
        ("refund_order", {"order_id": "O202411280002", "reason": "damaged"}),
    ]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (321, 45)
    body = fake.chat_requests[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("stream", [False, True])
def test_missing_usage_is_counted_offline(fake: FakeOpenAI, tools: list[ToolSpec], stream: bool) -> None:
    fake.script(text("A fairly long answer about the order status.", usage=None))
    response = OpenAICompatibleClient(provider(fake), stream=stream).complete(ask("x", tools))
    assert response.usage.input_tokens > 50 and response.usage.output_tokens > 3


def test_errors_are_classified_for_an_operator(fake: FakeOpenAI, tools: list[ToolSpec]) -> None:
    client = OpenAICompatibleClient(provider(fake, timeout=0.5))

    fake.script(rate_limited(retry_after=7))
    with pytest.raises(ProviderRateLimitedError) as limited:
        client.complete(ask("x", tools))
    assert limited.value.retry_after == 7 and limited.value.status_code == 429

    fake.script(server_error(503))
    with pytest.raises(ProviderServerError, match="HTTP 503"):
        client.complete(ask("x", tools))

    fake.script(hang(3))
    with pytest.raises(ProviderTimeoutError, match=r"did not answer within 0\.5 s"):
        client.complete(ask("x", tools))

    fake.script(no_choices())
    with pytest.raises(MalformedResponseError, match="no choices"):
        client.complete(ask("x", tools))

    fake.script(not_json())
    with pytest.raises(MalformedResponseError, match="not JSON"):
        client.complete(ask("x", tools))

    with pytest.raises(UnknownModelError, match="model 'gpt-9' is not offered by provider 'acme'"):
        client.complete(ask("x", tools, model="acme/gpt-9"))


def test_a_refused_key_is_reported_without_the_key(fake: FakeOpenAI, tools: list[ToolSpec]) -> None:
    wrong = "sk-wrong-key-abcdefghijklmnop"
    client = OpenAICompatibleClient(provider(fake, api_key=wrong))
    with pytest.raises(ProviderAuthError) as refused:
        client.complete(ask("x", tools))
    assert str(refused.value) == "the API key for provider 'acme' was refused (HTTP 401); update the provider's key"
    assert wrong not in repr(client.config) and wrong[-4:] not in str(refused.value)


def test_an_unreachable_base_url_is_named() -> None:
    client = OpenAICompatibleClient(ProviderConfig("down", base_url="http://127.0.0.1:9/v1", timeout=2))
    with pytest.raises(ProviderConnectionError, match=r"could not connect to provider 'down' at http://127.0.0.1:9/v1"):
        client.complete(ModelRequest("down/m", [{"role": "user", "content": "hi"}], []))


def test_test_connection_reads_well(fake: FakeOpenAI) -> None:
    ok = OpenAICompatibleClient(provider(fake, models={"small": ModelInfo(), "huge": ModelInfo()})).test_connection()
    assert not ok.ok and ok.missing_models == ["huge"] and "configured but not offered: huge" in ok.message
    assert OpenAICompatibleClient(provider(fake)).test_connection().ok
    refused = OpenAICompatibleClient(provider(fake, api_key="nope-nope-nope")).test_connection()
    assert not refused.ok and "was refused" in refused.message


def test_the_fake_can_be_scripted_over_http(fake: FakeOpenAI, tools: list[ToolSpec]) -> None:
    # as a worker process would: script over HTTP, call through the SDK, read the records back
    base = fake.base_url
    httpx.post(f"{base}/_script", json={"behaviours": [text("scripted over HTTP")], "replace": True}).raise_for_status()
    httpx.post(f"{base}/_default", json={"kind": "text", "content": "default over HTTP"}).raise_for_status()
    client = OpenAICompatibleClient(provider(fake))

    assert client.complete(ask("x", tools)).content == "scripted over HTTP"
    assert client.complete(ask("x", tools)).content == "default over HTTP"
    records = httpx.get(f"{base}/_requests").json()["requests"]
    assert [r["path"] for r in records] == ["/v1/chat/completions", "/v1/chat/completions"]
    httpx.post(f"{base}/_reset").raise_for_status()
    assert fake.requests == []

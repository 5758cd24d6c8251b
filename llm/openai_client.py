"""One OpenAI-compatible provider through the official ``openai`` SDK.

The SDK never retries (``max_retries=0``): retries, failover and rate limits live in the
gateway, where they are visible in the trace. Every SDK failure becomes one of the
:mod:`llm.errors` classes with a message written for an operator.
"""

from __future__ import annotations

import email.utils
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import openai

from llm.config import ProviderConfig
from llm.errors import (
    MalformedResponseError,
    ModelError,
    ProviderAuthError,
    ProviderBadRequestError,
    ProviderConnectionError,
    ProviderError,
    ProviderRateLimitedError,
    ProviderServerError,
    ProviderTimeoutError,
    UnknownModelError,
    redact,
)
from llm.streaming import OnText
from runtime.serde import without_nul
from runtime.tokens import count_messages, count_specs, count_tokens
from runtime.types import Message, ModelRequest, ModelResponse, ToolCall, Usage

log = logging.getLogger(__name__)

_ALLOWED_KEYS: dict[str, tuple[str, ...]] = {
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "name", "tool_calls", "refusal"),
    "tool": ("role", "content", "tool_call_id"),
}


def to_wire_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Drop keys the runtime keeps for itself (e.g. a tool message's ``name``) that strict providers reject."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        allowed = _ALLOWED_KEYS.get(str(message.get("role")), tuple(message))
        item = {k: v for k, v in message.items() if k in allowed}
        if item.get("role") == "tool" and not isinstance(item.get("content"), str):
            item["content"] = json.dumps(item.get("content"), ensure_ascii=False, default=str)
        wire.append(item)
    return wire


def split_model(model: str) -> tuple[str, str]:
    """``"openai/gpt-4o-mini"`` -> ``("openai", "gpt-4o-mini")``; a bare name has no provider."""
    provider, sep, name = model.partition("/")
    return (provider, name) if sep else ("", model)


def parse_retry_after(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    if headers is None:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True)
class ConnectionCheck:
    """The readable result of :meth:`OpenAICompatibleClient.test_connection` (shown by an admin action)."""

    ok: bool
    provider: str
    base_url: str
    message: str
    latency_ms: int = 0
    models: list[str] = field(default_factory=list)
    missing_models: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message


class OpenAICompatibleClient:
    """A :class:`~runtime.protocols.ModelClient` for one OpenAI-compatible provider."""

    def __init__(
        self, config: ProviderConfig, *, stream: bool | None = None, http_client: Any = None, show_error_bodies: bool = True
    ) -> None:
        """``show_error_bodies=False`` (a tenant's own endpoint): no error message quotes what the target answered."""
        self.config = config
        self.stream = config.stream if stream is None else stream
        self.show_error_bodies = show_error_bodies
        self._secrets = config.secrets()
        kwargs: dict[str, Any] = {
            "api_key": config.api_key or "not-needed",
            "base_url": config.base_url,
            "timeout": config.timeout,
            "max_retries": 0,
            "default_headers": dict(config.default_headers) or None,
        }
        if http_client is not None:
            kwargs["http_client"] = http_client
        self._sdk = openai.OpenAI(**kwargs)

    def __repr__(self) -> str:
        return f"OpenAICompatibleClient(provider={self.config.name!r}, base_url={self.config.base_url!r})"

    @property
    def name(self) -> str:
        return self.config.name

    # -- calls ----------------------------------------------------------------------------

    def complete(self, request: ModelRequest) -> ModelResponse:
        return self._complete(request, None)

    def complete_streaming(self, request: ModelRequest, on_text: OnText) -> ModelResponse:
        """Always streams, and hands each text fragment to ``on_text`` as it arrives (before the reply is whole)."""
        return self._complete(request, on_text)

    def _complete(self, request: ModelRequest, on_text: OnText | None) -> ModelResponse:
        provider, model = split_model(request.model)
        if provider and provider != self.config.name:
            raise ProviderError(
                f"model {request.model!r} was sent to provider {self.config.name!r}; expected '{self.config.name}/<model>'",
                provider=self.config.name,
                model=request.model,
            )
        params: dict[str, Any] = {"model": model, "messages": to_wire_messages(request.messages)}
        if request.tools:
            params["tools"] = [tool.to_openai() for tool in request.tools]
            params["parallel_tool_calls"] = True
        max_output = getattr(request, "max_output_tokens", None)
        if max_output:
            params["max_tokens"] = int(max_output)  # the field every OpenAI-compatible server understands
        started = time.monotonic()
        try:
            if on_text is not None or self.stream:
                response = self._complete_streaming(request, model, params, on_text)
            else:
                response = self._complete_plain(request, model, params)
        except ModelError:
            raise
        except Exception as exc:
            raise self._classify(exc, model) from None
        log.debug(
            "provider %s model %s answered in %.0f ms (%d in, %d out)",
            self.config.name,
            model,
            (time.monotonic() - started) * 1000,
            response.usage.input_tokens,
            response.usage.output_tokens,
        )
        return response

    def _complete_plain(self, request: ModelRequest, model: str, params: dict[str, Any]) -> ModelResponse:
        completion = self._sdk.chat.completions.create(**params)
        if isinstance(completion, str | bytes):
            raise MalformedResponseError(
                f"provider {self.config.name!r} answered model {model!r} with a body that is not JSON; "
                f"check that {self.config.base_url} is an OpenAI-compatible API",
                provider=self.config.name,
                model=model,
            )
        choices = getattr(completion, "choices", None)
        if not choices:
            raise MalformedResponseError(
                f"provider {self.config.name!r} returned a completion for model {model!r} with no choices",
                provider=self.config.name,
                model=model,
            )
        choice = choices[0]
        message = choice.message
        calls = [
            ToolCall(
                id=without_nul(call.id or f"call_{index}"),
                name=without_nul(call.function.name),
                arguments=without_nul(call.function.arguments if call.function.arguments is not None else ""),
            )
            for index, call in enumerate(message.tool_calls or [])
            if getattr(call, "function", None) is not None
        ]
        usage = self._usage(completion.usage, request, model, message.content, calls)
        return ModelResponse(
            content=without_nul(message.content),
            tool_calls=calls,
            usage=usage,
            model=f"{self.config.name}/{model}",
            finish_reason=choice.finish_reason or ("tool_calls" if calls else "stop"),
        )

    def _complete_streaming(
        self, request: ModelRequest, model: str, params: dict[str, Any], on_text: OnText | None = None
    ) -> ModelResponse:
        stream = self._sdk.chat.completions.create(**params, stream=True, stream_options={"include_usage": True})
        content: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        finish_reason: str | None = None
        usage_obj: Any = None
        saw_choice = False
        with stream:
            for chunk in stream:
                if getattr(chunk, "usage", None) is not None:
                    usage_obj = chunk.usage
                for choice in chunk.choices or []:
                    saw_choice = True
                    delta = choice.delta
                    if delta is not None and delta.content:
                        content.append(delta.content)
                        if on_text is not None:
                            on_text(without_nul(delta.content))
                    for part in (delta.tool_calls if delta is not None else None) or []:
                        slot = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                        if part.id:
                            slot["id"] = part.id
                        if part.function is not None:
                            if part.function.name:
                                slot["name"] += part.function.name
                            if part.function.arguments:
                                slot["arguments"] += part.function.arguments
                    if choice.finish_reason:
                        finish_reason = choice.finish_reason
        if not saw_choice:
            raise MalformedResponseError(
                f"provider {self.config.name!r} streamed no choices for model {model!r}",
                provider=self.config.name,
                model=model,
            )
        tool_calls = [
            ToolCall(id=without_nul(slot["id"] or f"call_{index}"), name=without_nul(slot["name"]),
                     arguments=without_nul(slot["arguments"]))
            for index, slot in sorted(calls.items())
        ]
        text = without_nul("".join(content)) or None
        return ModelResponse(
            content=text,
            tool_calls=tool_calls,
            usage=self._usage(usage_obj, request, model, text, tool_calls),
            model=f"{self.config.name}/{model}",
            finish_reason=finish_reason or ("tool_calls" if tool_calls else "stop"),
        )

    @staticmethod
    def _usage(raw: Any, request: ModelRequest, model: str, content: str | None, calls: list[ToolCall]) -> Usage:
        """The provider's usage when it sent one; otherwise counted offline (marked by nothing but the numbers)."""
        prompt = getattr(raw, "prompt_tokens", None) if raw is not None else None
        completion = getattr(raw, "completion_tokens", None) if raw is not None else None
        if prompt is None or completion is None:
            prompt = count_messages(request.messages, model) + count_specs(request.tools, model)
            completion = count_tokens(content or "", model) + sum(count_tokens(c.name + c.arguments, model) for c in calls)
        return Usage(int(prompt), int(completion), 0.0)

    # -- errors ---------------------------------------------------------------------------

    def _classify(self, exc: Exception, model: str) -> ProviderError:
        name, url = self.config.name, self.config.base_url
        common: dict[str, Any] = {"provider": name, "model": model}
        if isinstance(exc, openai.APITimeoutError):
            return ProviderTimeoutError(
                f"provider {name!r} did not answer within {self.config.timeout:g} s (model {model!r}, {url})", **common
            )
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            if type(cause).__name__ == "ResponseTooLarge":  # the egress guard's bound on a tenant's endpoint
                return MalformedResponseError(
                    f"provider {name!r} at {url} sent an answer this console does not take ({cause}); a model's "
                    "answer is far smaller, so check what the endpoint serves", **common)
            detail = f": {type(cause).__name__}" if cause is not None else ""
            return ProviderConnectionError(
                f"could not connect to provider {name!r} at {url}{detail}; check the base URL and that the endpoint is reachable",
                **common,
            )
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            common["status_code"] = status
            detail = self._provider_detail(exc)
            if status in (401, 403):
                return ProviderAuthError(
                    f"the API key for provider {name!r} was refused (HTTP {status}); update the provider's key",
                    **common,
                )
            if status == 404:
                return UnknownModelError(f"model {model!r} is not offered by provider {name!r} (HTTP 404 from {url}){detail}", **common)
            if status == 429:
                retry_after = parse_retry_after(exc.response.headers)
                hint = f"; retry after {retry_after:g} s" if retry_after is not None else ""
                return ProviderRateLimitedError(
                    f"provider {name!r} rate-limited model {model!r} (HTTP 429){hint}{detail}",
                    retry_after=retry_after,
                    **common,
                )
            if status >= 500:
                return ProviderServerError(f"provider {name!r} failed with HTTP {status} for model {model!r}{detail}", **common)
            return ProviderBadRequestError(f"provider {name!r} rejected the request for model {model!r} (HTTP {status}){detail}", **common)
        if isinstance(exc, openai.APIResponseValidationError | json.JSONDecodeError | AttributeError | TypeError):
            return MalformedResponseError(
                f"provider {name!r} sent a response for model {model!r} that is not a valid chat completion ({type(exc).__name__})",
                **common,
            )
        if isinstance(exc, openai.APIError):
            detail = f": {redact(str(exc.message), self._secrets)[:300]}" if self.show_error_bodies else f" ({type(exc).__name__})"
            return ProviderError(f"provider {name!r} failed for model {model!r}{detail}", **common)
        return ProviderError(
            f"calling provider {name!r} for model {model!r} failed unexpectedly ({type(exc).__name__}: "
            f"{redact(str(exc), self._secrets)[:300]})",
            **common,
        )

    def _provider_detail(self, exc: openai.APIStatusError) -> str:
        if not self.show_error_bodies:
            return ""
        body = exc.body
        text = ""
        if isinstance(body, dict):
            inner = body.get("error", body)
            text = str(inner.get("message", "")) if isinstance(inner, dict) else str(inner)
        elif body:
            text = str(body)
        text = redact(text, self._secrets).strip()
        return f": {text[:300]}" if text else ""

    # -- admin ----------------------------------------------------------------------------

    def test_connection(self) -> ConnectionCheck:
        """List the provider's models; say plainly what is wrong when that fails."""
        name, url = self.config.name, self.config.base_url
        started = time.monotonic()
        try:
            page = self._sdk.models.list()
            offered = sorted(m.id for m in page.data)
        except Exception as exc:
            error = self._classify(exc, "(model list)")
            if isinstance(error, UnknownModelError):
                message = f"provider {name!r} at {url} is reachable but does not list models (HTTP 404 on /models)"
                return ConnectionCheck(True, name, url, message, int((time.monotonic() - started) * 1000))
            return ConnectionCheck(False, name, url, str(error), int((time.monotonic() - started) * 1000))
        latency = int((time.monotonic() - started) * 1000)
        missing = [m for m in self.config.models if m not in offered]
        message = f"provider {name!r} at {url} answered in {latency} ms and offers {len(offered)} model(s)"
        if missing:
            message += f"; configured but not offered: {', '.join(missing)}"
        return ConnectionCheck(not missing, name, url, message, latency, offered, missing)

    def close(self) -> None:
        self._sdk.close()

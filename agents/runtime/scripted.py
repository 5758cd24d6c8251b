"""A scripted model for tests and benchmarks: replies come from a list, no network."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.runtime.types import ModelRequest, ModelResponse, ToolCall, Usage

Reply = ModelResponse | Callable[[ModelRequest], ModelResponse]


def say(text: str, usage: Usage | None = None) -> ModelResponse:
    return ModelResponse(content=text, tool_calls=[], usage=usage or Usage(10, 5), model="scripted")


def call(name: str, arguments: dict[str, Any] | str, *, call_id: str | None = None, usage: Usage | None = None) -> ModelResponse:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ModelResponse(
        content=None,
        tool_calls=[ToolCall(call_id or f"call_{name}_{abs(hash(raw)) % 10_000}", name, raw)],
        usage=usage or Usage(10, 5),
        model="scripted",
        finish_reason="tool_calls",
    )


@dataclass
class ScriptedModel:
    """Returns the scripted replies in order; records every request it was given."""

    replies: Sequence[Reply]
    requests: list[ModelRequest] = field(default_factory=list)

    def complete(self, request: ModelRequest) -> ModelResponse:
        if len(self.requests) >= len(self.replies):
            raise RuntimeError(f"the scripted model has only {len(self.replies)} replies; call {len(self.requests) + 1} was unexpected")
        reply = self.replies[len(self.requests)]
        self.requests.append(request)
        return reply(request) if callable(reply) else reply

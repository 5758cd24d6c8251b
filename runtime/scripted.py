"""A scripted model for tests and benchmarks: replies come from a list, no network.

Summarize requests (``task="summarize"``) are answered by ``summarizer`` and do not consume the
script, so a test scripts only the agent's turns. With ``measure_usage`` the reported usage is
the offline token count of the request and reply (like a real provider), not the scripted one.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.tokens import count_messages, count_specs, count_tokens
from runtime.types import ModelRequest, ModelResponse, ToolCall, Usage

Reply = ModelResponse | Callable[[ModelRequest], ModelResponse]

_ids = itertools.count(1)


def say(text: str, usage: Usage | None = None) -> ModelResponse:
    return ModelResponse(content=text, tool_calls=[], usage=usage or Usage(10, 5), model="scripted")


def call(name: str, arguments: dict[str, Any] | str, *, call_id: str | None = None, usage: Usage | None = None) -> ModelResponse:
    return calls([(name, arguments)], call_ids=[call_id] if call_id else None, usage=usage)


def calls(
    specs: Sequence[tuple[str, dict[str, Any] | str]],
    *,
    call_ids: Sequence[str] | None = None,
    usage: Usage | None = None,
) -> ModelResponse:
    """One reply asking for several tool calls. Call ids are unique unless given."""
    tool_calls = []
    for index, (name, arguments) in enumerate(specs):
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        call_id = call_ids[index] if call_ids else f"call_{name}_{next(_ids)}"
        tool_calls.append(ToolCall(call_id, name, raw))
    return ModelResponse(content=None, tool_calls=tool_calls, usage=usage or Usage(10, 5), model="scripted", finish_reason="tool_calls")


def default_summary(request: ModelRequest) -> ModelResponse:
    return say("Earlier: the user asked a question and tools were called.")


@dataclass
class ScriptedModel:
    """Returns the scripted replies in order; records every request it was given."""

    replies: Sequence[Reply]
    requests: list[ModelRequest] = field(default_factory=list)
    summarizer: Callable[[ModelRequest], ModelResponse] = default_summary
    summary_requests: list[ModelRequest] = field(default_factory=list)
    measure_usage: bool = False

    def complete(self, request: ModelRequest) -> ModelResponse:
        if request.task == "summarize":
            self.summary_requests.append(request)
            return self._measured(request, self.summarizer(request))
        if len(self.requests) >= len(self.replies):
            raise RuntimeError(f"the scripted model has only {len(self.replies)} replies; call {len(self.requests) + 1} was unexpected")
        reply = self.replies[len(self.requests)]
        self.requests.append(request)
        return self._measured(request, reply(request) if callable(reply) else reply)

    def _measured(self, request: ModelRequest, response: ModelResponse) -> ModelResponse:
        if not self.measure_usage:
            return response
        input_tokens = count_messages(request.messages, request.model) + count_specs(request.tools, request.model)
        output_text = (response.content or "") + "".join(c.arguments for c in response.tool_calls)
        output_tokens = count_tokens(output_text, request.model) + 1
        return ModelResponse(
            response.content,
            list(response.tool_calls),
            Usage(input_tokens, output_tokens),
            response.model,
            response.finish_reason,
            list(response.trace),
        )

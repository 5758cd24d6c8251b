"""An llm node: one model call with its rendered prompt through the tenant's model gateway (the deterministic planner
serves ``demo/planner``); with an ``output_schema`` the reply must be JSON of that shape."""

from __future__ import annotations

import json
import time
from typing import Any

from jmespath.exceptions import JMESPathError

from audit.masking import mask_text
from flows.nodes.base import Attempt, NodeFailed
from runtime.flows import render
from runtime.types import Event, ModelRequest


def run(a: Attempt) -> Any:
    from agents.model_clients import model_client_for

    node, run = a.node, a.run
    try:
        prompt = render(node.prompt or "", a.scope)
    except (JMESPathError, ValueError) as exc:
        raise NodeFailed(f"the prompt could not be rendered: {exc}") from None
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    if node.output_schema:
        messages.insert(0, {"role": "system", "content": "Reply with JSON only, no prose around it, matching this JSON "
                            f"Schema: {json.dumps(node.output_schema, ensure_ascii=False)}"})
    metadata: dict[str, Any] = {"run_id": str(run.pk), **({"output_schema": node.output_schema} if node.output_schema else {})}
    request = ModelRequest(model=node.model or run.version.model, tools=[], task="summarize", messages=messages,
                           metadata=metadata)
    began = time.monotonic()
    response = model_client_for(run).complete(request)
    a.trace.append(Event("model.call", {"model": response.model, **response.usage.to_dict(), "node": node.id,
                                        "latency_ms": int((time.monotonic() - began) * 1000)}, parent_span_id=a.span))
    if node.output_schema:
        return checked_reply(node.output_schema, response.content or "")
    return response.content or ""


def checked_reply(schema: dict[str, Any], content: str) -> Any:
    """The model's reply as the JSON its node's ``output_schema`` asks for; ``NodeFailed`` saying where it is not."""
    from runtime.schemas import CheckError, problems_of

    try:
        value = json.loads(content)
    except ValueError:
        raise NodeFailed("the model's reply is not the JSON the node's output_schema asks for") from None
    try:
        problems = problems_of(schema, value)
    except CheckError as exc:
        raise NodeFailed(f"the model's reply could not be checked against the node's output_schema: {exc}") from None
    if problems:
        shown = "; ".join(f"{'/'.join(map(str, p.absolute_path)) or 'the reply'}: {p.message}"[:200] for p in problems[:3])
        raise NodeFailed(f"the model's reply does not match the node's output_schema ({mask_text(shown)})")
    return value

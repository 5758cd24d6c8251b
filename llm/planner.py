"""The deterministic planner: a ModelClient that needs no LLM (the embedded default and the no-LLM path).

Given the last user message and the visible tools it scores intent (:mod:`llm.intent`),
fills arguments from each tool's JSON Schema (:mod:`llm.extract`) and either

- asks for the chosen tools (all at once: they are independent, their arguments come from the message),
- or, once the turn's tool results are in, answers with a summary of them (or asks for a
  tool whose argument only a result could supply),
- or asks for exactly the required field it could not find,
- or says plainly what it can do when no tool matches.

It answers in the user's language (Chinese when the user wrote Chinese). Its reasoning is in
``response.trace`` as a ``planner.plan`` entry. Usage is counted offline; cost is 0.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from llm.extract import Extraction, extract_arguments
from llm.intent import IntentScore, choose, has_cjk, score_tools, split_name
from runtime.tokens import count_messages, count_specs, count_tokens
from runtime.types import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec, Usage

MAX_RESULT_CHARS = 600
_THANKS = re.compile(r"^\W*(thanks|thank you|thx|ok|okay|great|谢谢|多谢|好的|感谢)\b", re.IGNORECASE)


def message_text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


@dataclass
class _Plan:
    phase: str
    language: str
    scores: dict[str, float] = field(default_factory=dict)
    intent: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    missing: list[tuple[ToolSpec, list[str]]] = field(default_factory=list)
    content: str | None = None

    def trace(self) -> dict[str, Any]:
        return {
            "type": "planner.plan",
            "phase": self.phase,
            "language": self.language,
            "intent": self.intent,
            "scores": self.scores,
            "calls": [{"id": c.id, "name": c.name, "arguments": json.loads(c.arguments)} for c in self.calls],
            "missing": [{"tool": tool.name, "fields": fields} for tool, fields in self.missing],
        }


class DeterministicPlanner:
    """Plans tool calls from keywords and schemas. ``clock`` fixes "today" for relative dates."""

    def __init__(self, *, clock: Callable[[], datetime] | None = None, model: str = "demo/planner") -> None:
        self.clock = clock or datetime.now
        self.model = model

    def __repr__(self) -> str:
        return f"DeterministicPlanner(model={self.model!r})"

    def complete(self, request: ModelRequest) -> ModelResponse:
        plan = self._summarize(request.messages) if request.task == "summarize" else self._plan(request)
        schema = request.metadata.get("output_schema")
        if isinstance(schema, dict):  # an llm node asks for JSON of a shape: the summary, shaped
            plan = dataclasses.replace(plan, content=json.dumps(_instance(schema, plan.content or ""), ensure_ascii=False))
        return self._response(request, plan)

    # -- planning -------------------------------------------------------------------------

    def _plan(self, request: ModelRequest) -> _Plan:
        messages = request.messages
        user_indexes = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        user_text = message_text(messages[user_indexes[-1]]) if user_indexes else ""
        turn = messages[user_indexes[-1] + 1 :] if user_indexes else list(messages)
        results = [m for m in turn if m.get("role") == "tool"]
        called = {c.get("function", {}).get("name") for m in turn for c in m.get("tool_calls") or []}
        names = {c.get("id"): c.get("function", {}).get("name") for m in turn for c in m.get("tool_calls") or []}
        plan = _Plan(phase="plan", language="zh" if has_cjk(user_text) else "en")

        source = "\n".join([user_text, *(message_text(m) for m in results)])
        scores, chosen, found = self._choose(user_text, source, request.tools)
        if not chosen and not results and len(user_indexes) > 1:
            # A short follow-up ("O202411280001") may answer the question asked for the previous
            # request: only tools that lacked an argument then are reconsidered.
            earlier = message_text(messages[user_indexes[-2]])
            _, before, found_before = self._choose(earlier, earlier, request.tools)
            lacking = {s.tool.name for s in before if found_before[s.tool.name].missing}
            if lacking:
                user_text = f"{earlier}\n{user_text}"
                source = user_text
                scores, chosen, found = self._choose(user_text, source, request.tools)
                chosen = [s for s in chosen if s.tool.name in lacking]
        plan.scores = {s.tool.name: s.score for s in scores if s.score > 0}
        plan.intent = [s.tool.name for s in chosen]

        step = request.metadata.get("step")
        if not isinstance(step, int):
            step = sum(1 for m in messages if m.get("role") == "assistant") + 1
        for score in chosen:
            if score.tool.name in called:
                continue
            extraction = found[score.tool.name]
            if extraction.missing:
                plan.missing.append((score.tool, extraction.missing))
                continue
            arguments = json.dumps(extraction.arguments, ensure_ascii=False, sort_keys=True)
            plan.calls.append(ToolCall(f"call_{step}_{len(plan.calls)}", score.tool.name, arguments))

        if plan.calls:
            return plan
        if results:
            plan.phase = "answer"
            plan.content = self._summary_of_results(results, names, plan)
        elif plan.missing:
            plan.phase = "clarify"
            plan.content = self._ask_for(plan.missing, plan.language)
        elif _THANKS.search(user_text):
            plan.phase = "courtesy"
            plan.content = "不客气！还有其他需要帮忙的吗？" if plan.language == "zh" else "You're welcome! Anything else I can help with?"
        else:
            plan.phase = "no_match"
            plan.content = self._capabilities(request.tools, plan.language)
        return plan

    def _choose(
        self, intent_text: str, source: str, tools: list[ToolSpec]
    ) -> tuple[list[IntentScore], list[IntentScore], dict[str, Extraction]]:
        scores = score_tools(intent_text, tools)
        found = {s.tool.name: extract_arguments(s.tool.parameters or {}, source, today=self.clock) for s in scores if s.score > 0}
        chosen = choose(scores, {name: not e.missing for name, e in found.items()})
        return scores, chosen, found

    # -- answers --------------------------------------------------------------------------

    def _summary_of_results(self, results: list[Message], names: dict[Any, Any], plan: _Plan) -> str:
        zh = plan.language == "zh"
        lines = ["查询结果如下：" if zh else "Here is what I found:"]
        for message in results:
            tool = message.get("name") or names.get(message.get("tool_call_id")) or "tool"
            rendered = _render(message_text(message), zh)
            lines.append(f"- {tool}{'：' if zh else ': '}{rendered}")
        if plan.missing:
            lines.append("")
            lines.append(self._ask_for(plan.missing, plan.language))
        return "\n".join(lines)

    @staticmethod
    def _ask_for(missing: list[tuple[ToolSpec, list[str]]], language: str) -> str:
        zh = language == "zh"
        parts: list[str] = []
        for tool, fields in missing:
            props = (tool.parameters or {}).get("properties") or {}
            labels = [_field_label(name, props.get(name) or {}, zh) for name in fields]
            if zh:
                parts.append(f"要执行 {tool.name}，还需要您提供：{'、'.join(labels)}。")
            else:
                parts.append(f"To run {tool.name} I need {', '.join(labels)}. Please tell me the {' and the '.join(fields)}.")
        return "\n".join(parts)

    @staticmethod
    def _capabilities(tools: list[ToolSpec], language: str) -> str:
        zh = language == "zh"
        if not tools:
            if zh:
                return "抱歉，这个对话没有可用的工具，我无法处理这个请求。"
            return "I have no tools available in this conversation, so I cannot act on that request."
        lines = [
            "抱歉，我没有找到与您的请求匹配的功能。我可以帮您：" if zh else "I could not match your request to anything I can do. I can:"
        ]
        for tool in tools:
            summary = (tool.description or " ".join(split_name(tool.name))).strip().split("\n")[0]
            lines.append(f"- {tool.name}{'：' if zh else ': '}{summary}")
        lines.append(
            "请告诉我您需要什么，并附上订单号、日期等信息。" if zh else "Tell me what you need, with any IDs or dates it involves."
        )
        return "\n".join(lines)

    def _summarize(self, messages: list[Message]) -> _Plan:
        zh = any(has_cjk(message_text(m)) for m in messages if m.get("role") == "user")
        lines = ["此前对话摘要：" if zh else "Summary of the earlier conversation:"]
        labels = {"user": "用户" if zh else "User", "assistant": "助手" if zh else "Assistant"}
        for message in messages:
            role = message.get("role")
            text = message_text(message).strip()
            if role == "system":
                continue
            if role == "tool":
                lines.append(f"- {message.get('name') or 'tool'}: {_render(text, zh)[:200]}")
            elif role == "assistant" and message.get("tool_calls") and not text:
                called = ", ".join(c.get("function", {}).get("name", "") for c in message["tool_calls"])
                lines.append(f"- {labels['assistant']}: {'调用了' if zh else 'called'} {called}")
            elif text:
                lines.append(f"- {labels.get(str(role), str(role))}: {_clip(text, 200)}")
        return _Plan(phase="summarize", language="zh" if zh else "en", content="\n".join(lines))

    # -- response -------------------------------------------------------------------------

    def _response(self, request: ModelRequest, plan: _Plan) -> ModelResponse:
        model = request.model or self.model
        usage = Usage(
            count_messages(request.messages, model) + count_specs(request.tools, model),
            count_tokens(plan.content or "", model) + sum(count_tokens(c.name + c.arguments, model) for c in plan.calls),
            0.0,
        )
        return ModelResponse(
            content=plan.content,
            tool_calls=plan.calls,
            usage=usage,
            model=model,
            finish_reason="tool_calls" if plan.calls else "stop",
            trace=[plan.trace()],
        )


def _field_label(name: str, schema: dict[str, Any], zh: bool) -> str:
    hint = str(schema.get("description") or "").strip().rstrip(".")
    examples = schema.get("examples")
    if not hint and isinstance(examples, list) and examples:
        hint = ("例如 " if zh else "e.g. ") + str(examples[0])
    if not hint and schema.get("format") == "date":
        hint = "日期，格式 YYYY-MM-DD" if zh else "a date as YYYY-MM-DD"
    if not hint and schema.get("pattern"):
        hint = ("格式 " if zh else "matching ") + str(schema["pattern"])
    if not hint and schema.get("enum"):
        hint = ("可选 " if zh else "one of ") + ", ".join(str(v) for v in schema["enum"])
    if zh:
        return f"{name}（{hint}）" if hint else name
    return f"the {name} ({hint})" if hint else f"the {name}"


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _render(content: str, zh: bool) -> str:
    try:
        data = json.loads(content)
    except (TypeError, ValueError):
        return _clip(content, MAX_RESULT_CHARS)
    return _clip(_render_value(data, zh, 0), MAX_RESULT_CHARS)


def _render_value(value: Any, zh: bool, depth: int) -> str:
    sep, colon = ("，", "：") if zh else (", ", ": ")
    if isinstance(value, dict):
        if depth >= 3:
            return json.dumps(value, ensure_ascii=False)
        items = list(value.items())
        shown = [f"{k}{colon}{_render_value(v, zh, depth + 1)}" for k, v in items[:12]]
        more = len(items) - len(shown)
        text = sep.join(shown) + (f"{sep}…(+{more})" if more > 0 else "")
        return f"({text})" if depth else text
    if isinstance(value, list):
        if not value:
            return "无" if zh else "none"
        if all(not isinstance(v, dict | list) for v in value) and len(value) <= 8:
            return sep.join(str(v) for v in value)
        head = "; ".join(_render_value(v, zh, depth + 1) for v in value[:3])
        count = f"共 {len(value)} 项" if zh else f"{len(value)} items"
        return f"{count}{colon}{head}" + ("; …" if len(value) > 3 else "")
    if value is None:
        return "无" if zh else "none"
    if isinstance(value, bool):
        return ("是" if value else "否") if zh else ("yes" if value else "no")
    return str(value)


def _instance(schema: Any, text: str, depth: int = 0) -> Any:
    """A value of ``schema``'s shape for the deterministic planner's reply: its first enum value or const, else the
    summary for strings (clipped to ``maxLength``), the minimum or 0 for numbers, false, empty lists, and objects with
    their required properties filled in the same way."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    kind = next((k for k in kind if k != "null"), "null") if isinstance(kind, list) else kind
    if kind == "string":
        limit = schema.get("maxLength")
        return text[:limit] if isinstance(limit, int) else text
    if kind in ("number", "integer"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return (int(low) + (1 if "exclusiveMinimum" in schema else 0)) if kind == "integer" else low
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        return {name: _instance(properties.get(name, {}), text, depth + 1) for name in schema.get("required") or []
                if isinstance(name, str)}
    return None

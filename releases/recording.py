"""What a recorded run did, read for many runs at once (a fixed number of queries per chunk, none per run).

A run's recording is its committed trace: each model call (``model.call`` events: the reply's text, tool calls,
usage), each tool call's outcome (``tool.call`` events for the status, the ``tool`` message for what the model read),
the approvals it asked for, its inputs (text, facts, the session's earlier turns) and how it ended.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from agents.engine import HISTORY_TURNS
from agents.models import AgentKind, Run, RunEvent, RunMessage, Turn
from approvals.models import ApprovalRequest
from flows.models import FlowNodeRun
from runtime.types import ModelResponse, ToolCall, Usage
from tools.arguments import canonical_json


def canonical(name: str, arguments: Any) -> tuple[str, str]:
    """A call's key: the tool's name and its arguments in canonical JSON (the raw text when it is not JSON)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return name, arguments
    return name, canonical_json(arguments)


@dataclass
class Recording:
    run: Run
    #: The model's replies per task ("act", "summarize", "route"...), in the order they were made.
    responses: dict[str, list[ModelResponse]] = field(default_factory=dict)
    #: (tool, canonical arguments) -> the outcomes recorded for that call, in order: (status, content).
    outcomes: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)
    tools: list[dict[str, str]] = field(default_factory=list)
    approvals: list[str] = field(default_factory=list)
    earlier_turns: list[Turn] = field(default_factory=list)  # newest first, as the context builder reads them
    #: A flow run's node rows by node id: kind, status, inputs, output, error, chosen (``releases/flow_replay.py``).
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: A flow run's model usage per node (its llm nodes).
    node_usage: dict[str, Usage] = field(default_factory=dict)
    problem: str = ""  # why this run cannot be replayed (a flow run, an unfinished run, an erased conversation)

    @property
    def terminal_reason(self) -> str:
        return self.run.terminal_reason

    @property
    def output(self) -> str:
        return self.run.output

    @property
    def usage(self) -> Usage:
        return Usage.from_dict(self.run.usage or {})

    @property
    def latency_ms(self) -> float:
        if self.run.started_at is None or self.run.finished_at is None:
            return 0.0
        return round((self.run.finished_at - self.run.started_at).total_seconds() * 1000, 1)


def _response(payload: dict[str, Any]) -> ModelResponse:
    calls = [ToolCall(str(c.get("id", "")), str(c.get("name", "")), str(c.get("arguments", "")))
             for c in payload.get("tool_calls") or [] if isinstance(c, dict)]
    usage = Usage(int(payload.get("input_tokens") or 0), int(payload.get("output_tokens") or 0),
                  float(payload.get("cost") or 0.0))
    return ModelResponse(content=payload.get("content"), tool_calls=calls, usage=usage,
                         model=str(payload.get("model") or ""), finish_reason=str(payload.get("finish_reason") or "stop"))


def load(run_ids: list[Any]) -> list[Recording]:
    """The recordings of ``run_ids`` (in that order; unknown ids are left out): six queries whatever their number
    (seven when flow runs are among them)."""
    runs = {r.pk: r for r in Run.objects.filter(pk__in=run_ids).select_related("tenant", "agent", "version", "session")}
    turn_of = dict(Turn.objects.filter(run_id__in=list(runs)).values_list("run_id", "turn_seq"))
    # per session only the turns some run of the chunk saw: up to HISTORY_TURNS before each (not the whole session)
    spans: dict[Any, tuple[int, int]] = {}
    for pk, seq in turn_of.items():
        session = runs[pk].session_id
        low, high = spans.get(session, (seq, seq))
        spans[session] = (min(low, seq), max(high, seq))
    seen = Q(pk__in=[])
    for session, (low, high) in spans.items():
        seen |= Q(session_id=session, turn_seq__gte=low - HISTORY_TURNS, turn_seq__lt=high)
    by_session: dict[Any, list[Turn]] = defaultdict(list)
    for turn in Turn.objects.filter(seen).order_by("session_id", "-turn_seq") if spans else []:
        by_session[turn.session_id].append(turn)
    recordings: dict[Any, Recording] = {}
    for pk in run_ids:
        run = runs.get(pk)
        if run is None or pk in recordings:
            continue
        rec = recordings[pk] = Recording(run)
        seq = turn_of.get(pk)
        rec.earlier_turns = [t for t in by_session.get(run.session_id, []) if seq is not None and t.turn_seq < seq][:HISTORY_TURNS]
        if run.status != "finished":
            rec.problem = f"the run has not finished (it is {run.status}): only finished runs are replayed"
        elif run.session.erased_at is not None:
            rec.problem = "the conversation was erased: its recording is gone"
    ids = list(recordings)
    flows = [pk for pk, rec in recordings.items() if rec.run.agent.kind == AgentKind.FLOW]
    if flows:
        rows = FlowNodeRun.objects.filter(run_id__in=flows).order_by("run_id", "id")
        for row in rows.values("run_id", "node_id", "kind", "status", "inputs", "output", "error", "chosen"):
            recordings[row["run_id"]].nodes[row["node_id"]] = row
    contents: dict[tuple[Any, str], str] = {}
    for run_id, message in RunMessage.objects.filter(run_id__in=ids, message__role="tool").values_list("run_id", "message"):
        if isinstance(message, dict):
            contents[(run_id, str(message.get("tool_call_id", "")))] = str(message.get("content") or "")
    names: dict[tuple[Any, str], tuple[str, str]] = {}
    entries: dict[tuple[Any, str], dict[str, str]] = {}
    events = RunEvent.objects.filter(run_id__in=ids, type__in=("model.call", "tool.call")).order_by("run_id", "seq")
    for run_id, kind, payload in events.values_list("run_id", "type", "payload"):
        rec = recordings[run_id]
        if kind == "model.call" and "node" in payload:  # a flow's llm node
            rec.node_usage[str(payload["node"])] = _response(payload).usage
        elif kind == "model.call":
            response = _response(payload)
            rec.responses.setdefault(str(payload.get("task") or "act"), []).append(response)
            for call in response.tool_calls:
                key = canonical(call.name, call.arguments)
                names[(run_id, call.id)] = key
                entry = entries[(run_id, call.id)] = {"tool": key[0], "arguments": key[1], "status": ""}
                rec.tools.append(entry)
        else:
            call_id = str(payload.get("call_id", ""))
            key = names.get((run_id, call_id))
            if key is None:
                continue
            content = contents.get((run_id, call_id), str(payload.get("result") or ""))
            status = str(payload.get("status") or "ok")
            rec.outcomes.setdefault(key, []).append((status, content))
            if status != "pending_approval":  # a call that waited for a person: its outcome is the one after
                entries[(run_id, call_id)]["status"] = status
    asked = ApprovalRequest.objects.filter(run_id__in=ids).order_by("requested_at", "pk").values_list("run_id", "tool_name")
    for run_id, tool_name in asked:
        recordings[run_id].approvals.append(tool_name)
    return list(recordings.values())

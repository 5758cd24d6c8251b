"""Replays a recorded flow run on a candidate flow version, in memory (issue #16 for flows).

The candidate's graph is scheduled by the same pure planner the flow runner uses (``runtime.flows.plan``), one node at
a time. Each node's answer comes from the recorded node rows:

- ``tool`` nodes: the recorded call with the same tool and canonical arguments, after the candidate's policy (a tool
  the tenant cannot resolve, a switched-off tool, missing scopes are refused as live; a call its approval rules would
  hold is listed). A miss follows the batch's policy as for agents (``live_read``: read tools only, through the real
  gateway; **write tools never run live**);
- ``switch`` nodes: decided again over the replayed outputs (the candidate's conditions);
- ``llm`` nodes: the recorded reply of the same node in ``recorded`` mode; the candidate's model in ``live`` mode;
- ``agent`` and ``approval`` nodes: the recorded child run's answer, the recorded decision (a node the recording does
  not hold is a miss); ``map`` nodes are not replayed yet (a miss naming it).
"""

from __future__ import annotations

import json
import time
from typing import Any

from agents.engine import session_grants
from approvals.gate import ApprovalGate
from audit.masking import mask_text
from flows.runner import call_id, flow_input, version_definition
from releases.recording import Recording, canonical
from releases.replay import MISS, Candidate, CassetteTools, MemoryStore, Replayed
from runtime.flows import NodeState, choose, evaluate, node_arguments, plan, render
from runtime.protocols import Checkpoint
from runtime.types import ModelRequest, ToolCall, ToolContext, ToolStatus, Usage

#: The same bound as the flow runner's: a graph that keeps producing ready nodes is a bug, not a replay.
MAX_NODES = 1000


class _Stop(Exception):
    pass


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)


def recorded_facts(rec: Recording) -> tuple[list[dict[str, str]], int]:
    """(the tool calls, sorted: parallel branches have no order; the nodes that ran) of a recorded flow run."""
    calls = sorted(({"tool": k[0], "arguments": k[1], "status": row["status"]}
                    for row in rec.nodes.values() if row["kind"] == "tool" and row["status"] in ("done", "failed")
                    for k in [canonical(_tool_name(rec, row["node_id"]), row["inputs"] or {})]),
                   key=lambda c: (c["tool"], c["arguments"], c["status"]))
    ran = sum(1 for row in rec.nodes.values() if row["status"] in ("done", "failed"))
    return calls, ran


def _tool_name(rec: Recording, node_id: str) -> str:
    definition = rec.run.version.definition or {}
    for node in definition.get("nodes", []):
        if isinstance(node, dict) and node.get("id") == node_id:
            return str(node.get("tool") or "")
    return ""


def replay_flow(candidate: Candidate, rec: Recording, *, model: Any = None) -> Replayed:
    run = candidate.run_for(rec.run)
    flow = version_definition(candidate.version)
    tools = CassetteTools(candidate, rec, rec.run, MemoryStore(Checkpoint()), ApprovalGate(run), session_grants(run))
    tools.whitelist = sorted(flow.tool_names())
    tools.by_name = {t.name: t for t in candidate.tools}
    recorded_by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rec.nodes.values():
        if row["kind"] == "tool" and row["status"] in ("done", "failed"):
            key = canonical(_tool_name(rec, row["node_id"]), row["inputs"] or {})
            recorded_by_key.setdefault(key, []).append(row)
    states: dict[str, str] = {}
    outputs: dict[str, Any] = {}
    chosen: dict[str, list[str]] = {}
    routed: list[str] = []
    called: list[dict[str, str]] = []
    usage = Usage()
    ran = 0
    terminal, output = "final_answer", ""
    began = time.perf_counter()
    start = flow_input(rec.run)
    try:
        while True:
            step = plan(flow, states, chosen, routed=routed)
            for nid in step.skip:
                states[nid] = NodeState.SKIPPED
            if step.outcome is not None:
                scope = {"input": start, "nodes": outputs}
                if step.outcome == "succeeded":
                    try:
                        output = mask_text(_text(evaluate(flow.output, scope) if flow.output else outputs))
                    except Exception:
                        terminal, output = "error", ""
                else:
                    terminal = "error"
                break
            if not step.ready:
                if step.skip:
                    continue
                terminal = "error"
                break
            for nid in step.ready:
                ran += 1
                if ran > MAX_NODES:
                    raise _Stop(f"more than {MAX_NODES} nodes ran")
                node = flow.node(nid)
                scope = {"input": start, "nodes": outputs}
                before = len(called)
                status, value, error = _node(candidate, rec, node, scope, tools, recorded_by_key, called, model)
                for entry in called[before:]:  # a tool node's call, with how it ended (done / failed)
                    entry["status"] = str(status)
                if node.kind == "llm" and nid in rec.node_usage and model is None:
                    usage = usage + rec.node_usage[nid]
                elif node.kind == "llm" and isinstance(value, tuple):
                    value, used = value
                    usage = usage + used
                if status == NodeState.FAILED and node.on_error == "continue":
                    value = {"error": error}
                states[nid] = status
                outputs[nid] = value
                if node.kind == "switch" and status == NodeState.DONE:
                    chosen[nid] = list(value.get("chosen", [])) if isinstance(value, dict) else []
                if status == NodeState.FAILED and node.on_error == "route" and node.handler:
                    routed.append(node.handler)
    except _Stop as stop:
        terminal = MISS
        tools.misses.append(str(stop))
    latency = round((time.perf_counter() - began) * 1000, 1)
    called.sort(key=lambda c: (c["tool"], c["arguments"], c["status"]))
    return Replayed(terminal, output, ran, usage, latency, called, sorted(tools.approvals), tools.live_calls,
                    tools.misses, tools.audit)


def _node(candidate: Candidate, rec: Recording, node: Any, scope: dict[str, Any], tools: CassetteTools,
          recorded_by_key: dict[tuple[str, str], list[dict[str, Any]]], called: list[dict[str, str]],
          model: Any) -> tuple[str, Any, str]:
    recorded = rec.nodes.get(node.id)
    if node.kind == "switch":
        picked = choose(node, scope)
        return NodeState.DONE, {"chosen": picked}, ""
    if node.kind == "map":
        raise _Stop(f"{MISS}: map node {node.id!r} is not replayed yet")
    if node.kind == "tool":
        try:
            inputs = node_arguments(node, scope)
        except Exception as exc:
            return NodeState.FAILED, None, f"an input mapping could not be evaluated: {exc}"
        key = canonical(node.tool or "", inputs)
        called.append({"tool": key[0], "arguments": key[1]})
        hits = recorded_by_key.get(key)
        if hits:  # the policy first (refusals, approvals that would be needed), then the recorded answer
            refused, _ = tools.check(ToolCall(call_id(rec.run.pk, node.id), node.tool or "", json.dumps(inputs)))
            if refused is not None:
                return NodeState.FAILED, None, f"{refused.status}: {refused.content}"
            row = hits.pop(0) if len(hits) > 1 else hits[0]
            return (NodeState.DONE, row["output"], "") if row["status"] == "done" else (NodeState.FAILED, None, row["error"])
        tools.outcomes.pop(key, None)  # no node row recorded this call: a miss (the miss policy decides), never an answer
        outcome = tools.execute(ToolCall(call_id(rec.run.pk, node.id), node.tool or "", json.dumps(inputs)),
                                ToolContext(run_id=str(rec.run.pk), step=0, span_id=""))
        if tools.misses:
            raise _Stop(tools.misses[-1])
        if outcome.status != ToolStatus.OK:
            return NodeState.FAILED, None, f"{outcome.status}: {outcome.content}"
        try:
            return NodeState.DONE, json.loads(outcome.content), ""
        except ValueError:
            return NodeState.DONE, outcome.content, ""
    if node.kind == "llm" and model is not None:
        prompt = render(node.prompt or "", scope)
        request = ModelRequest(model=node.model or candidate.version.model, tools=[], task="summarize",
                               messages=[{"role": "user", "content": prompt}], metadata={})
        response = model.complete(request)
        text: Any = response.content or ""
        if node.output_schema:
            try:
                text = json.loads(text)
            except ValueError:
                return NodeState.FAILED, None, "the model's reply is not the JSON the node's output_schema asks for"
        return NodeState.DONE, (text, response.usage), ""
    if recorded is None or recorded["status"] not in ("done", "failed"):
        raise _Stop(f"{MISS}: the recording holds no result for {node.kind} node {node.id!r}")
    if node.kind == "approval":
        tools.approvals.append(f"flow:{node.id}")
    if recorded["status"] == "done":
        return NodeState.DONE, recorded["output"], ""
    return NodeState.FAILED, None, recorded["error"]

"""A flow run's next step, decided from its node rows with no database, lock or clock (issue #52: decide, store,
execute).

``flows/runner.py`` reads the rows under the run's lock and applies what this module says: ``flows/store.py`` writes
the rows and events, ``flows/nodes/`` runs the nodes. :func:`runtime.flows.plan` schedules the graph; this module
adds what a run's rows and bounds make of it:

1. Bookkeeping first (:attr:`Decision.bookkeeping`): nodes the graph skips, ready maps to open (their list
   evaluated once, kept on the map's row), running maps to settle (their items' results in order) and item nodes to
   skip. The runner writes it, reads the rows again and decides again, until there is none.
2. Then the flow is over (:attr:`Decision.outcome`, :func:`ending`), or nodes are ready: top-level ones and map
   items' nodes. :func:`handed_over` says whether starting them only takes the places the same transaction's
   completions freed (no count of the tenant's running nodes needed); :func:`admit` puts them within the run's
   ``max_parallel`` and the tenant's bound (the rest are held); :func:`starts` gives each its attempt, token, span,
   lease and inputs; :func:`throttled` and :func:`waits` say whether the run records ``flow.throttled`` or waits for
   a person.

A node's row is read through :class:`NodeRow` (``flows.models.FlowNodeRun`` is one); statuses are the values of
:class:`runtime.flows.NodeState`.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.flows import (
    MAP_MAX_ITEMS,
    BodyNode,
    FlowDefinition,
    MapStep,
    Node,
    NodeState,
    evaluate,
    item_node_id,
    item_output,
    item_scope,
    node_arguments,
    plan,
    plan_map,
    split_item_node_id,
)
from runtime.types import Event, new_span_id

#: The longest text of a value an event carries (a node's inputs, its output).
SUMMARY_CHARS = 500

PENDING, RUNNING, WAITING = NodeState.PENDING.value, NodeState.RUNNING.value, NodeState.WAITING.value
DONE, FAILED = NodeState.DONE.value, NodeState.FAILED.value
_OVER = (DONE, FAILED)
#: An item's node: ``(map id, item index, body node id)``.
Item = tuple[str, int, str]


class NodeRow(Protocol):
    """What the planner reads of a node's row."""

    status: str
    kind: str
    chosen: list[str]
    output: Any
    error: str
    inputs: dict[str, Any]
    attempt: int
    span_id: str
    lease_expires_at: dt.datetime | None
    finished_at: dt.datetime | None


Rows = Mapping[str, NodeRow]


def summary(value: Any) -> str:
    """A value as an event shows it: text as is, anything else as JSON, at most ``SUMMARY_CHARS``."""
    return as_text(value)[:SUMMARY_CHARS]


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)


def call_id(run_id: Any, node_id: str) -> str:
    """The node's call id on every attempt, the key of its write's exactly-once ledger row (``ToolContext.call_key``;
    at most 99 characters: tool audit and approval rows hold 100)."""
    return f"fl:{uuid.UUID(str(run_id)).hex}:{node_id}"


# -- what expressions read ------------------------------------------------------------------------------------


def scope(flow_input: Any, rows: Rows) -> dict[str, Any]:
    """``{"input": ..., "nodes": ...}``: the flow's input and its finished top-level nodes' outputs."""
    nodes = {nid: r.output for nid, r in rows.items() if r.status in _OVER and "[" not in nid}  # not a map's items
    return {"input": flow_input, "nodes": nodes}


def body_node(mapnode: Node, child: str) -> BodyNode:
    assert mapnode.body is not None
    return next(n for n in mapnode.body.nodes if n.id == child)


def item_outputs(rows: Rows, map_id: str, index: int) -> dict[str, Any]:
    prefix = f"{map_id}[{index}]."
    return {nid[len(prefix):]: r.output for nid, r in rows.items() if nid.startswith(prefix) and r.status in _OVER}


def scope_of_item(flow_input: Any, rows: Rows, mapnode: Node, index: int) -> dict[str, Any]:
    """What one item's body nodes read: the flow's scope, the item's outputs, ``item`` and ``index``."""
    items = rows[mapnode.id].inputs.get("items") or []
    return item_scope(scope(flow_input, rows), items[index], index, item_outputs(rows, mapnode.id, index))


def reads_only_itself(flow: FlowDefinition, node_id: str) -> bool:
    """A top-level tool or agent node: its inputs were evaluated when it started, so its own row is all it reads."""
    if split_item_node_id(node_id) is not None:
        return False
    return next((n.kind for n in flow.nodes if n.id == node_id), None) in ("tool", "agent")


def node_and_scope(flow: FlowDefinition, node_id: str, flow_input: Any, rows: Rows) -> tuple[BodyNode, dict[str, Any]]:
    """The node a row runs (a map's item row runs its body node) and the scope its expressions read."""
    parts = split_item_node_id(node_id)
    if parts is None:
        return flow.node(node_id), scope(flow_input, rows)
    mapnode = flow.node(parts[0])
    return body_node(mapnode, parts[2]), scope_of_item(flow_input, rows, mapnode, parts[1])


# -- the states the graph is planned from ---------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """The rows as the scheduler sees them: a ``running`` node whose lease expired (``stale``: its worker died) and a
    waiting node whose approval was decided (``redo``) are pending again."""

    states: dict[str, str]
    stale: frozenset[str]
    chosen: dict[str, list[str]]
    routed: list[str]
    items_busy: int  #: map items' running nodes


def view(flow: FlowDefinition, rows: Rows, now: dt.datetime, redo: Collection[str] = ()) -> View:
    states = {nid: r.status for nid, r in rows.items()}
    for nid in redo:
        if states.get(nid) == WAITING:
            states[nid] = PENDING  # an approved (or rejected) tool call: the gateway hears the decision
    stale = stale_nodes(rows, now)
    for nid in stale:
        states[nid] = PENDING  # its worker died: start it again
    chosen = {nid: r.chosen for nid, r in rows.items() if r.kind == "switch" and r.status == DONE}
    top = flow.shape.dependencies
    items_busy = sum(1 for nid, s in states.items() if s == RUNNING and nid not in top)
    return View(states, stale, chosen, _routed(flow, rows), items_busy)


def stale_nodes(rows: Rows, now: dt.datetime) -> frozenset[str]:
    """Running nodes whose lease expired: their worker died."""
    return frozenset(nid for nid, r in rows.items()
                     if r.status == RUNNING and r.lease_expires_at is not None and r.lease_expires_at < now)


def _routed(flow: FlowDefinition, rows: Rows) -> list[str]:
    """The handlers failed top-level nodes route to."""
    top = flow.shape.dependencies
    return [h for nid, r in rows.items() if r.status == FAILED and nid in top
            for h in [flow.node(nid).handler] if h and flow.node(nid).on_error == "route"]


# -- bookkeeping: rows written before the decision ---------------------------------------------------------------


@dataclass(frozen=True)
class MapOpened:
    """A ready map, opened: its list (None when it failed: not a list, too long, an error) and its span."""

    node_id: str
    items: list[Any] | None
    count: int | None  #: the evaluated list's length (a list too long is counted, not kept)
    error: str
    output: Any
    span_id: str


@dataclass(frozen=True)
class MapSettled:
    """A map whose items are over: its output is their results in item order (or its error)."""

    node_id: str
    status: str
    output: Any
    error: str
    failed_items: tuple[int, ...]
    span_id: str  #: the map's own span


@dataclass(frozen=True)
class Bookkeeping:
    """Rows to write before deciding again; one of its fields is set. ``skip``: node rows (top-level or items')."""

    skip: tuple[str, ...] = ()
    opened: tuple[MapOpened, ...] = ()
    settled: tuple[MapSettled, ...] = ()

    def events(self) -> list[Event]:
        """The trace of this bookkeeping, one step."""
        events = [Event("flow.node.skipped", {"node": nid}) for nid in self.skip]
        for o in self.opened:
            events.append(Event("flow.node.started", {"node": o.node_id, "kind": "map", "attempt": 1, "items": o.count},
                                span_id=o.span_id))
            if o.error:
                events.append(Event("flow.node.finished", {"node": o.node_id, "kind": "map", "status": "failed",
                                                           "error": o.error}, parent_span_id=o.span_id))
        for s in self.settled:
            payload: dict[str, Any] = {"node": s.node_id, "kind": "map", "status": s.status, "output": summary(s.output),
                                       "failed_items": list(s.failed_items)}
            if s.error:
                payload["error"] = s.error
            events.append(Event("flow.node.finished", payload, parent_span_id=s.span_id))
        return events


def open_map(node: Node, flow_scope: Mapping[str, Any]) -> MapOpened:
    """A ready map's list, evaluated once (a resumed map sees the same items); a value that is not a list, or a list
    too long, fails the node."""
    error = ""
    try:
        items = evaluate(node.over or "", flow_scope)
    except Exception as exc:
        items, error = None, f"the map's list could not be evaluated: {exc}"
    if not error and not isinstance(items, list):
        error = f"the map's list {node.over!r} is not a list (it is {type(items).__name__}); a map runs over a list"
    elif not error and len(items) > MAP_MAX_ITEMS:
        error = f"the map's list has {len(items)} items; a map takes at most {MAP_MAX_ITEMS}"
    return MapOpened(node.id, None if error else items, len(items) if isinstance(items, list) else None, error,
                     {"error": error} if error and node.on_error == "continue" else None, new_span_id())


def map_steps(flow: FlowDefinition, rows: Rows, states: Mapping[str, str]) -> dict[str, MapStep]:
    """Each running map's next step (:func:`runtime.flows.plan_map`) from its item rows."""
    out: dict[str, MapStep] = {}
    for node in flow.nodes:
        if node.kind != "map" or states.get(node.id) != RUNNING:
            continue
        item_states: dict[int, dict[str, str]] = {}
        chosen: dict[int, dict[str, list[str]]] = {}
        for nid, status in states.items():
            parts = split_item_node_id(nid)
            if parts is None or parts[0] != node.id:
                continue
            item_states.setdefault(parts[1], {})[parts[2]] = status
            if rows[nid].kind == "switch" and status == DONE:
                chosen.setdefault(parts[1], {})[parts[2]] = rows[nid].chosen
        count = len(rows[node.id].inputs.get("items") or [])
        out[node.id] = plan_map(node, count, item_states, chosen, room=flow.max_parallel)
    return out


def item_error(rows: Rows, map_id: str, index: int, now: dt.datetime) -> str:
    """Why an item failed: its first failed node's error."""
    prefix = f"{map_id}[{index}]."
    failed = sorted((r.finished_at or now, nid) for nid, r in rows.items() if nid.startswith(prefix) and r.status == FAILED)
    if not failed:
        return "failed"
    nid = failed[0][1]
    return f"node {nid[len(prefix):]}: {rows[nid].error}"


def settle_map(node: Node, step: MapStep, rows: Rows, flow_scope: Mapping[str, Any], now: dt.datetime) -> MapSettled:
    """A map that is over: its items' results in order (a failed item's ``{"error": ...}``), or the first failed
    item's error when the map failed."""
    row = rows[node.id]
    items = row.inputs.get("items") or []
    errors = {i: item_error(rows, node.id, i, now) for i in step.failed}
    error = ""
    output: Any
    if step.outcome == "failed":
        first = min(errors)
        error = f"item {first} failed: {errors[first]}"
        output = {"error": error} if node.on_error == "continue" else None
    else:
        output = [{"error": errors[i]} if i in errors else _item_result(node, rows, flow_scope, items[i], i)
                  for i in range(len(items))]
    return MapSettled(node.id, FAILED if error else DONE, output, error, step.failed, row.span_id)


def _item_result(node: Node, rows: Rows, flow_scope: Mapping[str, Any], item: Any, index: int) -> Any:
    outs = item_outputs(rows, node.id, index)
    try:
        return item_output(node, item_scope(flow_scope, item, index, outs), outs)
    except Exception as exc:
        return {"error": f"the item's output could not be evaluated: {exc}"}


def _map_bookkeeping(flow: FlowDefinition, rows: Rows, steps: Mapping[str, MapStep], flow_input: Any,
                     now: dt.datetime) -> Bookkeeping | None:
    """The first running map's item skips, else every map that is over, settled."""
    for map_id, step in steps.items():
        if step.skip:
            return Bookkeeping(skip=tuple(item_node_id(map_id, i, c) for i, c in step.skip))
    over = [(map_id, step) for map_id, step in steps.items() if step.outcome is not None]
    if not over:
        return None
    flow_scope = scope(flow_input, rows)
    return Bookkeeping(settled=tuple(settle_map(flow.node(m), step, rows, flow_scope, now) for m, step in over))


# -- the decision -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """The flow's next step. With ``bookkeeping``, nothing else holds yet: write it and decide again."""

    view: View
    outcome: str | None = None  #: ``succeeded`` or ``failed``: the flow is over
    failed_node: str | None = None  #: the node whose failure fails the flow (it may still have nodes in flight)
    ready: tuple[str, ...] = ()  #: top-level nodes (not maps) the graph lets start, in its order
    wanted: tuple[Item, ...] = ()  #: running maps' item nodes the maps let start
    maps_running: bool = False
    bookkeeping: Bookkeeping | None = None

    @property
    def wants_to_start(self) -> bool:
        return bool(self.ready or self.wanted)


def decide(flow: FlowDefinition, rows: Rows, *, flow_input: Any, now: dt.datetime, redo: Collection[str] = ()) -> Decision:
    """The next step from the committed rows: bookkeeping to write first, else the outcome or what is ready."""
    seen = view(flow, rows, now, redo)
    step = plan(flow, seen.states, seen.chosen, routed=seen.routed, busy=seen.items_busy)
    if step.skip:
        return Decision(seen, bookkeeping=Bookkeeping(skip=step.skip))
    maps = [flow.node(n) for n in step.ready if flow.node(n).kind == "map"]
    if maps:
        flow_scope = scope(flow_input, rows)
        return Decision(seen, bookkeeping=Bookkeeping(opened=tuple(open_map(node, flow_scope) for node in maps)))
    steps = map_steps(flow, rows, seen.states)
    book = _map_bookkeeping(flow, rows, steps, flow_input, now) if steps else None
    if book is not None:
        return Decision(seen, maps_running=True, bookkeeping=book)
    # a map cut short by another node's failure starts no more items
    wanted = () if step.failed_node else tuple((m, i, c) for m, ms in steps.items() for i, c in ms.ready)
    return Decision(seen, step.outcome, step.failed_node, tuple(n for n in step.ready if flow.node(n).kind != "map"),
                    wanted, maps_running=bool(steps))


def own_live(rows: Rows, stale: Collection[str], now: dt.datetime) -> int:
    """This run's running nodes whose lease is alive."""
    return sum(1 for nid, r in rows.items() if r.status == RUNNING and nid not in stale
               and r.lease_expires_at is not None and r.lease_expires_at >= now)


def handed_over(flow: FlowDefinition, decision: Decision, own: int, *, freed: int, bound: int) -> int | None:
    """The tenant's running work outside this run, when the nodes about to start only take the places the same
    transaction's completions freed (a chain's next node, a join after its branches): then the tenant's bound cannot
    be passed by starting them and its running nodes need not be counted. None: they must be counted (under the
    tenant's lock). Not with an approval among them: a decision with one counts as before.

    Every start (this one included) is decided under the tenant's lock and leaves its live nodes within the bound, and
    live nodes only ever stop; the completions freed ``freed`` places, so the others hold at most the bound less this
    run's live nodes and those."""
    starting = len(decision.ready) + len(decision.wanted)
    if not 0 < starting <= freed or any(flow.node(n).kind == "approval" for n in decision.ready):
        return None
    return max(bound - own - freed, 0)


@dataclass(frozen=True)
class Admission:
    """The ready nodes within the bounds: ``starts`` (top-level), ``asks`` (approval nodes: a person, not a task),
    ``items`` (maps' item nodes); ``held`` wait for room (row ids); ``busy``: the tenant's running work counted."""

    starts: tuple[str, ...] = ()
    asks: tuple[str, ...] = ()
    items: tuple[Item, ...] = ()
    held: tuple[str, ...] = ()
    busy: int = 0


def admit(flow: FlowDefinition, decision: Decision, *, bound: int, busy: int) -> Admission:
    """Start what the tenant's bound (``bound`` less its running work, ``busy``) and the run's ``max_parallel`` leave
    room for: top-level nodes first (approval nodes take no place), then items' nodes, lowest index first."""
    room = max(bound - busy, 0)
    held = [n for n in decision.ready if flow.node(n).kind != "approval"][room:]
    ready = [n for n in decision.ready if n not in held]
    states = decision.view.states
    running = decision.view.items_busy + sum(1 for n in flow.nodes if states.get(n.id) == RUNNING and n.kind != "map")
    item_room = max(min(flow.max_parallel - running - len(ready), room - len(ready)), 0)
    held += [item_node_id(m, i, c) for m, i, c in decision.wanted[item_room:]]
    return Admission(starts=tuple(n for n in ready if flow.node(n).kind != "approval"),
                     asks=tuple(n for n in ready if flow.node(n).kind == "approval"),
                     items=decision.wanted[:item_room], held=tuple(held), busy=busy)


@dataclass(frozen=True)
class Start:
    """A node to start: its row's new fields (``inputs`` holds ``_mapping_error`` when a mapping could not be
    evaluated: the node then fails) and what its ``flow.node.started`` event says."""

    node_id: str
    kind: str
    attempt: int
    inputs: dict[str, Any]
    span_id: str
    token: str
    lease_seconds: float
    map_id: str | None = None
    index: int | None = None
    parent_span_id: str | None = None

    def event(self) -> Event:
        payload: dict[str, Any] = {"node": self.node_id, "kind": self.kind, "attempt": self.attempt}
        if self.map_id is not None:
            payload.update(map=self.map_id, index=self.index)
        payload["inputs"] = summary(self.inputs)
        return Event("flow.node.started", payload, span_id=self.span_id, parent_span_id=self.parent_span_id)


def starts(flow: FlowDefinition, rows: Rows, admission: Admission, *, flow_input: Any, grace: float) -> list[Start]:
    """The admitted nodes' starts, top-level nodes first: a new token, the next attempt, the span they had (a
    restart keeps it), their inputs, a lease of their timeout plus ``grace``."""
    flow_scope = scope(flow_input, rows)
    out = [_start(nid, flow.node(nid), rows.get(nid), flow_scope, grace) for nid in admission.starts]
    for map_id, index, child in admission.items:
        mapnode = flow.node(map_id)
        nid = item_node_id(map_id, index, child)
        out.append(_start(nid, body_node(mapnode, child), rows.get(nid), scope_of_item(flow_input, rows, mapnode, index),
                          grace, map_id=map_id, index=index, parent_span_id=rows[map_id].span_id))
    return out


def _start(nid: str, node: BodyNode, row: NodeRow | None, node_scope: Mapping[str, Any], grace: float, *,
           map_id: str | None = None, index: int | None = None, parent_span_id: str | None = None) -> Start:
    try:
        inputs = node_arguments(node, node_scope)
    except Exception as exc:  # a mapping that cannot be evaluated (a JMESPath type error): the node fails
        inputs = {"_mapping_error": str(exc)}
    span = row.span_id if row is not None and row.span_id else new_span_id()
    return Start(nid, node.kind, (row.attempt if row is not None else 0) + 1, inputs, span, uuid.uuid4().hex,
                 node.timeout_seconds + grace, map_id, index, parent_span_id)


def throttled(admission: Admission, decision: Decision, *, started: bool, bound: int) -> Event | None:
    """``flow.throttled``, once: ready nodes held for room while nothing of the run runs."""
    if not admission.held or started or any(s == RUNNING for s in decision.view.states.values()):
        return None
    return Event("flow.throttled", {"waiting": list(admission.held), "tenant_running_nodes": admission.busy,
                                    "limit": bound})


def waits(decision: Decision, admission: Admission, *, started: bool) -> bool:
    """Nothing can run until a person decides: nothing in flight or held, a node waiting (an approval just asked
    for included)."""
    states = decision.view.states
    if started or admission.held or any(s == RUNNING for s in states.values()):
        return False
    return bool(admission.asks) or any(s == WAITING for s in states.values())


@dataclass(frozen=True)
class Ending:
    """How a flow that is over ends: its answer (``output``, the text of the definition's ``output`` value) or why it
    failed (``error``). Neither is masked yet."""

    succeeded: bool
    output: str = ""
    error: str = ""


def ending(flow: FlowDefinition, decision: Decision, rows: Rows, *, flow_input: Any) -> Ending:
    """The flow's end: the ``output`` expression over its scope; a failed node's error, or the expression's."""
    failed_node = decision.failed_node
    if decision.outcome == "succeeded":
        flow_scope = scope(flow_input, rows)
        try:
            value = evaluate(flow.output, flow_scope) if flow.output else flow_scope["nodes"]
        except Exception as exc:
            failed_node = f"output ({exc})"
        else:
            return Ending(True, output=as_text(value))
    row = rows.get(failed_node) if failed_node is not None else None
    return Ending(False, error=f"node {failed_node} failed: {row.error if row is not None else ''}")

"""Flows: a DAG of tool, agent, llm, approval and switch nodes, as a typed document, with its scheduler.

A flow definition (``FlowDefinition``; stored per flow version)::

    {"version": 1,
     "scopes": ["orders:read", "orders:refund"],            # what the flow's tool nodes may need
     "nodes": [
       {"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}},
       {"id": "logistics", "kind": "tool", "tool": "query_logistics", "inputs": {"order_id": "input.order_id"}},
       {"id": "route", "kind": "switch", "after": ["order", "logistics"],
        "cases": [{"when": "nodes.order.amount > `100`", "goto": ["approve"]}], "default": ["refund"]},
       {"id": "approve", "kind": "approval", "preview": "Refund {nodes.order.amount} for {input.order_id}?"},
       {"id": "refund", "kind": "tool", "tool": "refund_order", "after": ["approve"],
        "inputs": {"order_id": "input.order_id"}, "values": {"reason": "flow"}},
       {"id": "summary", "kind": "llm", "after": ["refund"], "prompt": "Summarize: {nodes.refund}"}],
     "output": "nodes.summary"}

``inputs`` and a case's ``when`` are JMESPath expressions over ``{"input": <the flow's input>, "nodes": {<id>:
<output>}}`` (never ``eval``); ``values`` are constants. A node runs once every node it depends on (its ``after``, and
a switch that names it) has finished and at least one of them let it through (it finished, or the switch chose it);
when none did, it is skipped, and so on down. So a switch's branches may join again. ``on_error``: ``fail`` (the
flow fails), ``continue`` (the node's output is its error and the flow goes on) or ``route`` (its ``handler`` node
runs instead; a handler has no ``after`` and runs only when routed to).

Checks that need the tenant (do the tools and agents exist, do the scopes cover the tools) take a
:class:`FlowCatalog` as ``context={"catalog": ...}``; the rest is pure. :func:`plan` is the scheduler: from the
nodes' states it says which nodes are ready, which are skipped, and whether the flow is over.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from graphlib import CycleError, TopologicalSorter
from types import MappingProxyType
from typing import Annotated, Any

from jmespath.exceptions import JMESPathError
from pydantic import ValidationInfo, model_validator

from runtime import expression_cost, expressions, schemas
from runtime.approval_policy import ApproverRoles
from runtime.documents import (
    Document,
    Leaf,
    Names,
    choice,
    flag,
    integer,
    json_object,
    json_schema,
    number,
    pattern,
    problem,
    problems,
    problems_of,
    text,
)

NODE_KINDS = ("tool", "agent", "llm", "approval", "switch", "map")
#: What a map's body may hold (a person's gate, a child agent or another map cannot run per item).
BODY_KINDS = ("tool", "llm", "switch")
#: Kinds a flow may run inline (in the task that started them): in-process and quick by nature or by the operator's word.
INLINE_KINDS = ("tool", "switch")
ITEM_ERRORS = ("fail", "continue")
#: The longest list a map node takes; a longer one fails the node.
MAP_MAX_ITEMS = 100
#: The most nodes a flow (or a map's body) holds, and the longest expression: a graph an operator can read, draw and
#: follow, whose checks and scheduling stay cheap. A longer chain is several flows (an agent node runs one).
MAX_NODES = 100
#: The most nodes a flow holds in all, its maps' bodies counted (each level may hold ``MAX_NODES``): a hundred maps of
#: a hundred nodes took 1.6 s of CPU to check at every save.
MAX_TOTAL_NODES = 400
MAX_EXPRESSION_CHARS = 2000
ON_ERROR = ("fail", "continue", "route")
_ID = r"^[a-z][a-z0-9_]{0,62}$"
NodeId = Annotated[str, pattern(_ID, "must be a node id: lower-case letters, digits and _ (e.g. lookup_order)")]
_TEMPLATE_FIELD = re.compile(r"\{([^{}]+)\}")
#: The fields whose text holds ``{expression}`` fields (``BodyNode.expressions`` names them so).
_TEMPLATES = (".prompt", ".preview")


def _expression(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise problem('must be a JMESPath expression over {"input": ..., "nodes": ...}, e.g. "input.order_id"', value)
    if len(value) > MAX_EXPRESSION_CHARS:
        raise problem(f"must be at most {MAX_EXPRESSION_CHARS} characters; got {len(value)}")
    try:
        too_much = expression_cost.work_problem(value)
    except JMESPathError as exc:
        raise problem(f"is not a JMESPath expression ({str(exc).splitlines()[0]})", value) from None
    if too_much:
        raise problem(too_much, value if len(value) <= 120 else f"{value[:120]}…")
    return value


Expression = Annotated[str, Leaf(_expression, {"type": "string", "description": "A JMESPath expression"})]


def referenced_nodes(expression: str) -> set[str]:
    """The node ids an expression reads (``nodes.<id>...``)."""
    return _referenced("nodes", expression)


def referenced_inputs(expression: str) -> set[str]:
    """The keys of the flow's input an expression reads (``input.<key>...``)."""
    return _referenced("input", expression)


def _referenced(root: str, expression: str) -> set[str]:
    found: set[str] = set()

    def walk(ast: Mapping[str, Any]) -> None:
        children = ast.get("children") or []
        if ast.get("type") == "subexpression" and len(children) >= 2:
            head, second = children[0], children[1]
            if head.get("type") == "field" and head.get("value") == root and second.get("type") == "field":
                found.add(str(second.get("value")))
        for child in children:
            if isinstance(child, dict):
                walk(child)

    walk(expressions.parse(expression).parsed)
    return found


def template_expressions(template: str) -> list[str]:
    """The ``{expression}`` fields of a prompt or preview template."""
    return [m.group(1).strip() for m in _TEMPLATE_FIELD.finditer(template)]


def _ids(value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and re.match(_ID, v) for v in value):
        raise problem("must be a non-empty list of node ids", value)
    return list(value)


class Case(Document):
    when: Expression
    goto: Annotated[list[str], Leaf(_ids, {"type": "array", "items": {"type": "string", "pattern": _ID}})]


#: The fields each kind takes besides the common ones (``id``, ``kind``, ``after``, ``inputs``, ``values``,
#: ``timeout_seconds``, ``retries``, ``on_error``, ``handler``, ``description``).
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "tool": ("tool",),
    "agent": ("agent",),
    "llm": ("prompt", "output_schema", "model"),
    "approval": ("preview", "expires_in_seconds", "approver_roles"),
    "switch": ("cases", "default"),
    "map": ("over", "body", "max_concurrency", "on_item_error"),
}
_REQUIRED = {"tool": "tool", "agent": "agent", "llm": "prompt", "switch": "cases", "map": "over"}
_ITEM_ID = re.compile(r"^([a-z][a-z0-9_]*)\[(\d+)\]\.([a-z][a-z0-9_]*)$")


def item_node_id(map_id: str, index: int, node_id: str) -> str:
    """The row id of a body node's run for one item: ``map_id[3].child_id``."""
    return f"{map_id}[{index}].{node_id}"


def split_item_node_id(value: str) -> tuple[str, int, str] | None:
    """``(map id, index, body node id)`` of an item node's row id, else None."""
    m = _ITEM_ID.match(value)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


class BodyNode(Document):
    """A node of a map's body (and the common fields of every node)."""

    id: NodeId
    kind: Annotated[str, choice(*BODY_KINDS)]
    description: Annotated[str | None, text()] = None
    after: list[NodeId] = []
    inputs: dict[str, Expression] = {}
    values: Annotated[dict[str, Any], json_object("must be an object of argument -> constant value")] = {}
    timeout_seconds: Annotated[float, number(nullable=False, maximum=3600)] = 60
    retries: Annotated[int, integer(0, maximum=5)] = 0
    on_error: Annotated[str, choice(*ON_ERROR)] = "fail"
    handler: Annotated[str | None, pattern(_ID, "must be a node id", nullable=True)] = None
    # tool
    tool: Annotated[str | None, text()] = None
    # agent
    agent: Annotated[str | None, text()] = None
    # llm
    prompt: Annotated[str | None, text()] = None
    output_schema: Annotated[dict[str, Any] | None, json_object("must be a JSON Schema object or null", nullable=True)] = None
    model: Annotated[str | None, text()] = None
    # approval
    preview: Annotated[str | None, text()] = None
    expires_in_seconds: Annotated[int, integer(10, maximum=30 * 86400)] = 3600
    approver_roles: ApproverRoles = ["owner", "approver"]  # who may decide: roles that can, at least one
    # switch
    cases: list[Case] = []
    default: list[NodeId] = []

    @model_validator(mode="after")
    def _kind_fields(self) -> BodyNode:
        found = []
        required = _REQUIRED.get(self.kind)
        if required and not getattr(self, required):
            found.append(f"$.{required}: required for a {self.kind} node")
        others = {f for kind, fields in KIND_FIELDS.items() if kind != self.kind for f in fields} - set(KIND_FIELDS[self.kind])
        others &= set(type(self).model_fields)
        given = {name for name in others & self.model_fields_set if getattr(self, name) != type(self).model_fields[name].default}
        for name in sorted(given):
            found.append(f"$.{name}: not a field of a {self.kind} node; it takes {list(KIND_FIELDS[self.kind]) or 'no own fields'}")
        if self.on_error == "route" and not self.handler:
            found.append('$.handler: required when on_error is "route": the node that runs instead')
        if self.handler and self.on_error != "route":
            found.append('$.handler: only with on_error "route"')
        if self.retries and self.kind not in ("tool", "llm"):
            found.append(f"$.retries: only tool and llm nodes are retried, not a {self.kind} node")
        if self.output_schema:
            found += output_schema_problems(self.output_schema)
        if found:
            raise problems_of(found)
        return self

    def expressions(self) -> list[tuple[str, str]]:
        """``(relative path, expression)`` of every expression the node evaluates."""
        out = [(f".inputs.{name}", expr) for name, expr in self.inputs.items()]
        out += [(f".cases[{i}].when", case.when) for i, case in enumerate(self.cases)]
        over = getattr(self, "over", None)
        out += [(".over", over)] if over else []
        for name in ("prompt", "preview"):
            template = getattr(self, name)
            out += [(f".{name}", expr) for expr in template_expressions(template or "")]
        return out

    def targets(self) -> list[str]:
        """The nodes a switch may choose."""
        return [t for case in self.cases for t in case.goto] + list(self.default)


@dataclass(frozen=True)
class FlowCatalog:
    """What a tenant's flow may name: its tools (name -> required scopes) and agents (slugs)."""

    tools: Mapping[str, Iterable[str]] = field(default_factory=dict)
    agents: Iterable[str] = ()


def _parse_nodes(model: type[BodyNode], value: Any, what: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise problem(f"must be a non-empty list of {what}", value)
    if len(value) > MAX_NODES:
        raise problem(f"must hold at most {MAX_NODES} nodes; got {len(value)} (split the work into flows that an agent "
                      "node or a client chains)")
    parsed, found = [], []
    for index, item in enumerate(value):
        node, errors = problems(model, item, path=f"$[{index}]")
        found += errors
        if node is not None:
            parsed.append(node)
    if found:
        raise problems_of(found)
    return parsed


def _nodes(value: Any) -> list[Node]:
    if isinstance(value, list):
        bodies = [item.get("body") for item in value if isinstance(item, dict)]
        total = len(value) + sum(len(b["nodes"]) for b in bodies if isinstance(b, dict) and isinstance(b.get("nodes"), list))
        if total > MAX_TOTAL_NODES:
            raise problem(f"must hold at most {MAX_TOTAL_NODES} nodes in all, the bodies of its maps counted; got {total} "
                          "(split the work into flows that an agent node or a client chains)")
    return _parse_nodes(Node, value, "nodes")


def _body_nodes(value: Any) -> list[BodyNode]:
    return _parse_nodes(BodyNode, value, f"nodes (of kind {', '.join(BODY_KINDS)})")


class MapBody(Document):
    """The sub-graph a map runs per item. Its expressions also read ``item`` and ``index``; ``output`` (over the
    item's scope) is the item's result, by default the object of the body's node outputs."""

    nodes: Annotated[list[BodyNode], Leaf(_body_nodes, {"type": "array", "minItems": 1, "items": json_schema(BodyNode)})]
    output: Annotated[str | None, Leaf(_expression, {"type": "string"}, nullable=True)] = None


class Node(BodyNode):
    kind: Annotated[str, choice(*NODE_KINDS)]
    # map
    over: Annotated[str | None, Leaf(_expression, {"type": "string", "description": "A JMESPath expression: the list"},
                                     nullable=True)] = None
    body: MapBody | None = None
    max_concurrency: Annotated[int, integer(1, maximum=32)] = 4
    on_item_error: Annotated[str, choice(*ITEM_ERRORS)] = "fail"
    #: tool and switch nodes: run in the task that started them, a wave's completions committed together (None: the
    #: flow's ``inline``); other kinds always run as tasks of their own.
    inline: Annotated[bool | None, flag(nullable=True)] = None

    @model_validator(mode="after")
    def _map_fields(self) -> Node:
        if self.kind == "map" and self.body is None:
            raise problems_of(["$.body: required for a map node: {\"nodes\": [...]}, the sub-graph run per item"])
        return self


class FlowDefinition(Document):
    version: Annotated[int, integer(1, maximum=1)] = 1
    description: Annotated[str | None, text()] = None
    scopes: Names = []
    nodes: Annotated[list[Node], Leaf(_nodes, {"type": "array", "minItems": 1, "items": json_schema(Node)})]
    output: Annotated[str | None, Leaf(_expression, {"type": "string"}, nullable=True)] = None
    max_parallel: Annotated[int, integer(1, maximum=32)] = 4
    #: cheap in-process nodes (tool and switch) run inline: see ``Node.inline`` and README "Flows"
    inline: Annotated[bool, flag()] = False
    #: what a run's input must be (a JSON Schema, Draft 2020-12, of an object): checked before the run is created
    input_schema: Annotated[dict[str, Any] | None, json_object("must be a JSON Schema of an object, or null",
                                                               nullable=True)] = None

    @model_validator(mode="after")
    def _graph(self, info: ValidationInfo) -> FlowDefinition:
        found = input_schema_problems(self.input_schema) or graph_problems(self) or undeclared_input_problems(self)
        catalog = (info.context or {}).get("catalog")
        if not found and isinstance(catalog, FlowCatalog):
            found = catalog_problems(self, catalog)
        if found:
            raise problems_of(found)
        return self

    # -- the graph ------------------------------------------------------------------------------------------

    def node(self, node_id: str) -> Node:
        """The top-level node of this id (``KeyError`` if there is none): looked up many times a wave."""
        return self._by_id[node_id]

    @cached_property
    def _by_id(self) -> dict[str, Node]:
        return {n.id: n for n in self.nodes}

    def tool_names(self) -> frozenset[str]:
        """The tools the graph's tool nodes name, in map bodies too: a flow's tool list (worked out once)."""
        return self._tool_names

    @cached_property
    def _tool_names(self) -> frozenset[str]:
        every: list[BodyNode] = [*self.nodes, *(c for n in self.nodes if n.body for c in n.body.nodes)]
        return frozenset(n.tool for n in every if n.kind == "tool" and n.tool)

    def runs_inline(self, node_id: str) -> bool:
        """Whether a (top-level) node runs in the task that started it instead of a task of its own."""
        node = self._by_id.get(node_id)
        if node is None or node.kind not in INLINE_KINDS:
            return False
        return self.inline if node.inline is None else node.inline

    def dependencies(self) -> dict[str, set[str]]:
        """Each node's dependencies: its ``after`` and the switches that may choose it."""
        return {node_id: set(deps) for node_id, deps in self.shape.dependencies.items()}

    def handlers(self) -> set[str]:
        return set(self.shape.handlers)

    def order(self) -> list[str]:
        """The nodes in an order where each comes after its dependencies; ``CycleError`` when there is none."""
        return list(self.static_order)

    @cached_property
    def shape(self) -> GraphShape:
        """The graph's dependencies and handlers, worked out once per parsed definition (it is frozen): the runner
        plans every step of every run of a version from the same parsed definition."""
        deps = {n.id: set(n.after) for n in self.nodes}
        for n in self.nodes:
            for target in n.targets():
                if target in deps:
                    deps[target].add(n.id)
        return GraphShape(dependencies=MappingProxyType({k: frozenset(v) for k, v in deps.items()}),
                          handlers=frozenset(n.handler for n in self.nodes if n.handler))

    @cached_property
    def static_order(self) -> tuple[str, ...]:
        """:meth:`order`, worked out once (a graph with a cycle raises ``CycleError`` each time it is asked)."""
        return tuple(TopologicalSorter(self.shape.dependencies).static_order())


@dataclass(frozen=True)
class GraphShape:
    """What :attr:`FlowDefinition.shape` holds, read-only."""

    dependencies: Mapping[str, frozenset[str]]
    handlers: frozenset[str]


def _where(flow: FlowDefinition) -> dict[str, str]:
    return {n.id: f"$.nodes[{i}]" for i, n in enumerate(flow.nodes)}


@dataclass(frozen=True)
class _Level:
    """How the graph checks name one level of a flow: its nodes (``$.nodes``) or a map's body (``$.nodes[i].body``)."""

    at: str  #: the path of the object that holds ``nodes`` (and ``output``)
    noun: str = "node"
    them: str = "the nodes"
    graph: str = "a flow"
    map_id: str | None = None  #: the map whose body this is
    outer: frozenset[str] = frozenset()  #: the flow's node ids: a body node needs an id of its own
    upstream: frozenset[str] = frozenset()  #: the flow nodes that run before the map: its body may read them

    def body(self, map_id: str, at: str, outer: set[str], upstream: set[str]) -> _Level:
        return _Level(at=f"{at}.body", noun="body node", them="the body's nodes", graph="a map's body", map_id=map_id,
                      outer=frozenset(outer), upstream=frozenset(upstream))

    def unknown_read(self, ref: str, ids: list[str]) -> str:
        if self.map_id is None:
            return f"reads node {ref!r}, which does not exist; the nodes are {ids}"
        return (f"reads node {ref!r}, which is not a body node nor a flow node that runs before the map {self.map_id!r}; "
                f"the body's nodes are {ids}, the map's upstream nodes {sorted(self.upstream)}")


def input_schema_problems(schema: dict[str, Any] | None) -> list[str]:
    """Why ``schema`` cannot check a flow's input: not a JSON Schema (Draft 2020-12), or not one of an object."""
    if schema is None:
        return []
    if (wrong := schemas.invalid(schema)) is not None:
        return [f"$.input_schema{_json_path(wrong[0])}: {wrong[1]}"]
    if schema.get("type") != "object":
        return ['$.input_schema.type: must be "object": a flow\'s input is a JSON object (its keys are read as '
                f"input.<key>); got {json.dumps(schema.get('type'))}"]
    return [f"$.input_schema{_json_path(where)}: {problem}" for where, problem in schemas.unsafe_parts(schema)]


def output_schema_problems(schema: dict[str, Any]) -> list[str]:
    """Why an llm node's ``output_schema`` cannot check the model's reply (its paths relative to the node)."""
    if (wrong := schemas.invalid(schema)) is not None:
        return [f"$.output_schema{_json_path(wrong[0])}: {wrong[1]}"]
    return [f"$.output_schema{_json_path(where)}: {problem}" for where, problem in schemas.unsafe_parts(schema)]


def _json_path(parts: Iterable[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def input_problems(schema: dict[str, Any] | None, value: Any) -> list[str]:
    """What is wrong with a run's ``value`` for a flow whose ``input_schema`` is ``schema``, each naming its field
    (``input.order_id: ...``), in the fields' order; at most ten."""
    if not schema:
        return []
    found: set[str] = set()
    try:
        errors = schemas.problems_of(schema, value)
    except schemas.CheckError as exc:  # too slow, or a reference that does not resolve (saved before they were checked)
        return [f"input: could not be checked against the flow's input_schema: {exc}; an operator must fix the "
                "flow's version"]
    for error in errors:
        where = "input" + _json_path(error.absolute_path)
        if error.validator == "required" and isinstance(error.instance, dict):
            missing = [str(k) for k in error.validator_value if k not in error.instance]
            found.update(f"{where}.{key}: required" + _described(error.schema, key) for key in missing)
        elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
            declared = sorted((error.schema.get("properties") or {}).keys())
            extra = sorted(k for k in error.instance if k not in declared)
            found.add(f"{where}: unknown key(s) {', '.join(map(repr, extra))}; the flow takes {declared}")
        elif error.validator == "type":
            wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
            found.add(f"{where}: expected {' or '.join(map(str, wanted))}, got {_json_kind(error.instance)}")
        else:  # jsonschema's message quotes the value: a long one is cut
            message = error.message if len(error.message) <= 300 else f"{error.message[:300]}… (cut)"
            found.add(f"{where}: {message}")
    return sorted(found)[:10]


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)}"
    kinds = ((dict, "an object"), (list, "an array"), (str, "a string"), (int, "an integer"), (float, "a number"))
    kind = next((name for cls, name in kinds if isinstance(value, cls)), type(value).__name__)
    shown = json.dumps(value, default=str)
    return kind if isinstance(value, dict | list) or len(shown) > 40 else f"{kind} {shown}"


def undeclared_input_problems(flow: FlowDefinition) -> list[str]:
    """Expressions that read a key of the input that the flow's ``input_schema`` rules out (its ``properties``
    with ``additionalProperties: false``): such a mapping could never find a value."""
    schema = flow.input_schema or {}
    declared = schema.get("properties")
    if not isinstance(declared, dict) or schema.get("additionalProperties") is not False:
        return []
    where = _where(flow)
    located: list[tuple[str, BodyNode]] = [(where[n.id], n) for n in flow.nodes]
    located += [(f"{where[n.id]}.body.nodes[{i}]", c) for n in flow.nodes if n.kind == "map" and n.body
                for i, c in enumerate(n.body.nodes)]
    reads = [(f"{at}{path}", expression) for at, node in located for path, expression in node.expressions()]
    reads += [("$.output", flow.output)] if flow.output else []
    found = []
    for at, expression in reads:
        for key in sorted(referenced_inputs(expression) - set(declared)):
            found.append(f"{at}: reads input.{key}, which the flow's input_schema does not allow (its properties are "
                         f"{sorted(declared)}); declare it or read another key")
    return found


def _described(schema: Mapping[str, Any], key: str) -> str:
    spec = (schema.get("properties") or {}).get(key)
    return f" ({spec['description']})" if isinstance(spec, dict) and isinstance(spec.get("description"), str) else ""


def graph_problems(flow: FlowDefinition) -> list[str]:
    """Unique ids, known references, no cycle, expressions that only read upstream nodes, handlers that are free; the
    same for each map's body (whose ids differ from the flow's and whose nodes may also read the map's upstream)."""
    return _level_problems(flow, flow.output, _Level("$"))


def _level_problems(graph: FlowDefinition, output: str | None, level: _Level) -> list[str]:
    found: list[str] = []
    where: dict[str, str] = {}
    for index, node in enumerate(graph.nodes):
        path = f"{level.at}.nodes[{index}]"
        if node.id in where:
            found.append(f"{path}.id: {node.id!r} is already the id of {where[node.id][2:]}")
            continue
        if node.id in level.outer:
            found.append(f"{path}.id: {node.id!r} is already the id of a node of the flow; a body node needs its own")
        where[node.id] = path
        if level.map_id is not None and len(longest := item_node_id(level.map_id, MAP_MAX_ITEMS - 1, node.id)) > 63:
            found.append(f"{path}.id: {longest!r} (the map's id, an item's index and this id) is over 63 characters; "
                         "shorten the map's or this node's id")
    ids = sorted(where)
    for node in graph.nodes:
        for i, dep in enumerate(node.after):
            if dep not in where:
                hint = " (a body node runs after body nodes only; the map itself runs after flow nodes)" \
                    if dep in level.outer else ""
                found.append(f"{where[node.id]}.after[{i}]: no {level.noun} {dep!r}; {level.them} are {ids}{hint}")
            elif dep == node.id:
                found.append(f"{where[node.id]}.after[{i}]: a node cannot come after itself")
        for path, target in [*((f".cases[{i}].goto", t) for i, c in enumerate(node.cases) for t in c.goto),
                             *((".default", t) for t in node.default), *(((".handler", node.handler),) if node.handler else ())]:
            if target not in where:
                found.append(f"{where[node.id]}{path}: no {level.noun} {target!r}; {level.them} are {ids}")
    if found:
        return found
    handlers = graph.handlers()
    for node in graph.nodes:
        if node.id in handlers and (node.after or any(node.id in other.targets() for other in graph.nodes)):
            found.append(f"{where[node.id]}: {node.id!r} is an error handler, so it runs only when routed to; it cannot "
                         "also come after other nodes or be chosen by a switch")
    try:
        order = graph.order()
    except CycleError as exc:
        cycle = list(exc.args[1])
        return [*found, f"{level.at}.nodes: a cycle {' -> '.join(cycle)}; {level.graph} is a graph without cycles "
                        "(remove one of these dependencies)"]
    ancestors: dict[str, set[str]] = {}
    deps = graph.dependencies()
    for node_id in order:
        ancestors[node_id] = set().union(*(ancestors[d] | {d} for d in deps[node_id])) if deps[node_id] else set()
    for node in graph.nodes:
        for path, expression in node.expressions():
            try:
                read = referenced_nodes(expression)
                too_much = expression_cost.work_problem(expression) if path in _TEMPLATES else None
            except JMESPathError as exc:
                found.append(f"{where[node.id]}{path}: {expression!r} is not a JMESPath expression ({str(exc).splitlines()[0]})")
                continue
            if too_much:  # the other fields' expressions are refused by themselves (``_expression``)
                shown = expression if len(expression) <= 120 else f"{expression[:120]}…"
                found.append(f"{where[node.id]}{path}: {shown!r} {too_much}")
            found += _read_problems(f"{where[node.id]}{path}", read, where, ancestors[node.id], node.id, level)
    for node in graph.nodes:
        if node.kind == "map" and node.body is not None:
            body = level.body(node.id, where[node.id], set(where), ancestors[node.id])
            found += _level_problems(body_graph(node), node.body.output, body)
    if output:
        found += _read_problems(f"{level.at}.output", referenced_nodes(output), where, set(where), "the output", level)
    return found


def _read_problems(path: str, read: set[str], where: Mapping[str, str], before: set[str], who: str,
                   level: _Level) -> list[str]:
    """An expression's reads: nodes of its level that run before ``who``, or (in a body) flow nodes before the map."""
    found = []
    for ref in sorted(read):
        if ref in where and ref not in before:
            found.append(f"{path}: reads {level.noun} {ref!r}, which does not run before {who!r}; add it to {who}.after")
        elif ref not in where and ref not in level.upstream:
            found.append(f"{path}: {level.unknown_read(ref, sorted(where))}")
    return found


def body_graph(node: Node) -> FlowDefinition:
    """A map's body as a graph :func:`plan` schedules (built, not validated again: its node was)."""
    assert node.body is not None
    return FlowDefinition.model_construct(nodes=list(node.body.nodes), max_parallel=MAP_MAX_ITEMS, output=None)


def catalog_problems(flow: FlowDefinition, catalog: FlowCatalog) -> list[str]:
    """Tools and agents the tenant has, and scopes that cover the tools."""
    found: list[str] = []
    agents = set(catalog.agents)
    where = _where(flow)
    scopes = set(flow.scopes)
    located: list[tuple[str, BodyNode]] = [(where[n.id], n) for n in flow.nodes]
    located += [(f"{where[n.id]}.body.nodes[{i}]", c) for n in flow.nodes if n.kind == "map" and n.body
                for i, c in enumerate(n.body.nodes)]
    for at, node in located:
        if node.kind == "tool" and node.tool:
            if node.tool not in catalog.tools:
                found.append(f"{at}.tool: no tool {node.tool!r} for this tenant (its own, or from an installed "
                             "plugin); the tools are " + str(sorted(catalog.tools)))
            else:
                missing = sorted(set(catalog.tools[node.tool]) - scopes)
                if missing:
                    found.append(f"{at}.tool: {node.tool!r} needs the scopes {missing}, which the flow's scopes "
                                 f"{sorted(scopes)} do not cover; add them to scopes")
        if node.kind == "agent" and node.agent and node.agent not in agents:
            found.append(f"{at}.agent: no agent {node.agent!r} for this tenant; the agents are {sorted(agents)}")
    return found


# -- scheduling -------------------------------------------------------------------------------------------------


class NodeState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"  # an approval node waiting for a person
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"


FINISHED = frozenset({NodeState.DONE, NodeState.FAILED, NodeState.SKIPPED})


@dataclass(frozen=True)
class Plan:
    """What to do next: ``ready`` nodes to start (at most ``max_parallel`` running), ``skip`` nodes to mark skipped;
    ``outcome`` is ``succeeded`` or ``failed`` when the flow is over, else None."""

    ready: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    outcome: str | None = None
    failed_node: str | None = None


def plan(flow: FlowDefinition, states: Mapping[str, str], chosen: Mapping[str, Iterable[str]] | None = None,
         *, routed: Iterable[str] = (), busy: int = 0) -> Plan:
    """The next step of a flow from its nodes' states.

    ``chosen``: for each finished switch, the nodes it chose. ``routed``: handler nodes a failed node routed to.
    A failed node counts as finished-and-passing when its ``on_error`` is ``continue``; with ``fail`` the flow fails
    (once nothing is running); with ``route`` its handler runs. A running map holds no place of ``max_parallel``
    itself: its items' running nodes do (``busy``).
    """
    chosen = {k: set(v) for k, v in (chosen or {}).items()}
    routed_to = set(routed)
    state = {n.id: NodeState(states.get(n.id, NodeState.PENDING)) for n in flow.nodes}
    deps, handlers = flow.shape.dependencies, flow.shape.handlers
    running = busy + sum(1 for n in flow.nodes if state[n.id] == NodeState.RUNNING and n.kind != "map")
    failed = [n for n in flow.nodes if state[n.id] == NodeState.FAILED and n.on_error == "fail"]
    if failed:
        # a running map is over once its items' nodes are (``busy``): it starts no more items now
        in_flight = busy > 0 or any(state[n.id] in (NodeState.RUNNING, NodeState.WAITING) and n.kind != "map"
                                    for n in flow.nodes)
        outcome = "failed" if not in_flight else None
        return Plan(outcome=outcome, failed_node=failed[0].id)

    nodes = {n.id: n for n in flow.nodes}

    def passes(dep: str, node: str) -> bool:
        s = state[dep]
        if s == NodeState.SKIPPED:
            return False
        if s == NodeState.FAILED:
            return nodes[dep].on_error == "continue"
        if node in nodes[dep].targets():  # a switch that may choose this node: did it?
            return s == NodeState.DONE and node in chosen.get(dep, set())
        return s == NodeState.DONE

    ready: list[str] = []
    skip: list[str] = []
    for node_id in flow.static_order:
        if state[node_id] != NodeState.PENDING:
            continue
        if node_id in handlers:
            if node_id in routed_to:
                ready.append(node_id)
            elif _all_finished_except_handlers(flow, state, handlers):
                skip.append(node_id)
            continue
        if not deps[node_id]:
            ready.append(node_id)
            continue
        if not all(state[d] in FINISHED for d in deps[node_id]):
            continue
        if any(passes(d, node_id) for d in deps[node_id]):
            ready.append(node_id)
        else:
            skip.append(node_id)
            state[node_id] = NodeState.SKIPPED  # so nodes after it are decided in the same pass
    room = max(flow.max_parallel - running, 0)
    ready = ready[:room]
    pending_after = [n for n, s in state.items() if s not in FINISHED and n not in ready and n not in skip]
    if not ready and not pending_after:
        return Plan(skip=tuple(skip), outcome="succeeded")
    return Plan(ready=tuple(ready), skip=tuple(skip))


def _all_finished_except_handlers(flow: FlowDefinition, state: Mapping[str, NodeState], handlers: frozenset[str]) -> bool:
    return all(state[n.id] in FINISHED for n in flow.nodes if n.id not in handlers)


def evaluate(expression: str, scope: Mapping[str, Any], work: expressions.Work | None = None) -> Any:
    """An expression's value over ``{"input": ..., "nodes": ...}``; ``expressions.ValueTooLarge`` (a ``ValueError``)
    when it would make a value past the bound, or do more work than it (``runtime/expressions.py``). ``work``: the
    steps it shares with the other expressions of its node."""
    return expressions.search(expression, dict(scope), work)


def node_arguments(node: BodyNode, scope: Mapping[str, Any]) -> dict[str, Any]:
    """A node's arguments: its constants, then its inputs evaluated over the flow's input and earlier outputs (all of
    them within one work bound)."""
    work = expressions.Work()
    return {**node.values, **{name: evaluate(expr, scope, work) for name, expr in node.inputs.items()}}


def render(template: str, scope: Mapping[str, Any]) -> str:
    """A prompt or preview with each ``{expression}`` replaced by its value (text as is, anything else as JSON); all
    its fields within one work bound."""
    work = expressions.Work()

    def value(match: re.Match[str]) -> str:
        result = evaluate(match.group(1).strip(), scope, work)
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)

    return _TEMPLATE_FIELD.sub(value, template)


def choose(node: BodyNode, scope: Mapping[str, Any]) -> list[str]:
    """The nodes a switch chooses: the first case whose ``when`` holds, else its default (its cases within one work
    bound)."""
    work = expressions.Work()
    for case in node.cases:
        if evaluate(case.when, scope, work):
            return list(case.goto)
    return list(node.default)



# -- maps -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapStep:
    """A running map's next step: ``ready`` and ``skip`` are ``(index, body node id)``; ``outcome`` is ``succeeded``
    or ``failed`` once the map is over; ``failed`` are the items whose body failed, ``over`` the finished ones."""

    ready: tuple[tuple[int, str], ...] = ()
    skip: tuple[tuple[int, str], ...] = ()
    outcome: str | None = None
    failed: tuple[int, ...] = ()
    over: tuple[int, ...] = ()


def plan_map(node: Node, count: int, states: Mapping[int, Mapping[str, str]],
             chosen: Mapping[int, Mapping[str, Iterable[str]]] | None = None, *, room: int) -> MapStep:
    """The next step of a map over ``count`` items from its item nodes' states (``states[index][body node id]``).

    At most ``max_concurrency`` items are under way at once (started, not over), lowest index first; at most ``room``
    nodes start now (what the run's ``max_parallel`` and the tenant's bound leave). With ``on_item_error: fail`` a
    failed item starts nothing more and the map fails once no item node runs; with ``continue`` every item runs.
    """
    body = body_graph(node)
    chosen = chosen or {}
    ready: list[tuple[int, str]] = []
    skip: list[tuple[int, str]] = []
    failed: list[int] = []
    over: list[int] = []
    under_way: list[tuple[int, Plan]] = []
    running = False
    for index in range(count):
        item = states.get(index) or {}
        if not item:
            continue
        running = running or any(NodeState(s) == NodeState.RUNNING for s in item.values())
        routed = [n.handler for n in body.nodes if n.handler and n.on_error == "route"
                  and item.get(n.id) == NodeState.FAILED]
        step = plan(body, item, chosen.get(index), routed=routed)
        skip += [(index, nid) for nid in step.skip]
        if step.outcome is not None:
            over.append(index)
            if step.outcome == "failed":
                failed.append(index)
        else:
            under_way.append((index, step))
    stop = bool(failed) and node.on_item_error == "fail"
    if stop:
        return MapStep(skip=tuple(skip), outcome=None if running else "failed", failed=tuple(failed), over=tuple(over))
    for index, step in under_way:
        ready += [(index, nid) for nid in step.ready]
    fresh = [i for i in range(count) if not states.get(i)]
    slots = max(node.max_concurrency - len(under_way), 0)
    first = body.order()
    roots = [nid for nid in first if not body.dependencies()[nid] and nid not in body.handlers()]
    for index in fresh[:slots]:
        ready += [(index, nid) for nid in roots]
    ready = ready[:max(room, 0)]
    if not fresh and not under_way and not skip:
        return MapStep(outcome="succeeded", failed=tuple(failed), over=tuple(over))
    return MapStep(ready=tuple(ready), skip=tuple(skip), failed=tuple(failed), over=tuple(over))


def item_scope(scope: Mapping[str, Any], item: Any, index: int, outputs: Mapping[str, Any]) -> dict[str, Any]:
    """What a body node's expressions read: the flow's scope, the item's body outputs, ``item`` and ``index``."""
    return {**scope, "nodes": {**scope.get("nodes", {}), **outputs}, "item": item, "index": index}


def item_output(node: Node, scope: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
    """An item's result: its body's ``output`` over the item's scope, else the object of its body node outputs."""
    assert node.body is not None
    return evaluate(node.body.output, scope) if node.body.output else dict(outputs)

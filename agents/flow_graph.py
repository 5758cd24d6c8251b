"""A flow drawn as SVG on the server (no CDN, no script): nodes in columns by depth, edges left to right.

``states`` colours nodes by their state in a run (pending, running, waiting, done/succeeded, failed, skipped); without it,
nodes are coloured by kind. Everything a tenant wrote (ids, tool names) is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

from runtime.flows import FlowDefinition

NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 150, 44, 60, 18, 12
KIND_COLOURS = {"tool": "#dbeafe", "agent": "#ede9fe", "llm": "#dcfce7", "approval": "#fef3c7", "switch": "#f3f4f6"}
STATE_COLOURS = {"pending": "#f3f4f6", "running": "#bfdbfe", "waiting": "#fde68a", "done": "#bbf7d0", "succeeded": "#bbf7d0",
                 "failed": "#fecaca", "skipped": "#e5e7eb"}


def layout(flow: FlowDefinition) -> dict[str, tuple[int, int]]:
    """``node id -> (column, row)``: a node's column is the longest path to it from a node without dependencies."""
    deps = flow.dependencies()
    depth: dict[str, int] = {}
    for node_id in flow.order():
        depth[node_id] = 1 + max((depth[d] for d in deps[node_id]), default=-1)
    rows: dict[int, int] = {}
    placed: dict[str, tuple[int, int]] = {}
    for node in flow.nodes:  # in the definition's order within a column
        column = depth[node.id]
        placed[node.id] = (column, rows.get(column, 0))
        rows[column] = rows.get(column, 0) + 1
    return placed


def _label(node_id: str, subtitle: str) -> str:
    return (f'<text x="{NODE_W // 2}" y="18" text-anchor="middle" font-weight="600">{escape(node_id)}</text>'
            f'<text x="{NODE_W // 2}" y="34" text-anchor="middle" font-size="11" fill="#4b5563">{escape(subtitle)}</text>')


def render_svg(flow: FlowDefinition, states: Mapping[str, str] | None = None) -> str:
    placed = layout(flow)
    columns = 1 + max(c for c, _ in placed.values())
    height_rows = 1 + max(r for _, r in placed.values())
    width = PAD * 2 + columns * NODE_W + (columns - 1) * GAP_X
    height = PAD * 2 + height_rows * NODE_H + (height_rows - 1) * GAP_Y

    def origin(node_id: str) -> tuple[int, int]:
        column, row = placed[node_id]
        return PAD + column * (NODE_W + GAP_X), PAD + row * (NODE_H + GAP_Y)

    edges = []
    for node_id, deps in flow.dependencies().items():
        x2, y2 = origin(node_id)
        for dep in sorted(deps):
            x1, y1 = origin(dep)
            dashed = ' stroke-dasharray="4 3"' if node_id in flow.node(dep).targets() else ""
            edges.append(f'<line x1="{x1 + NODE_W}" y1="{y1 + NODE_H // 2}" x2="{x2}" y2="{y2 + NODE_H // 2}" '
                         f'stroke="#6b7280" marker-end="url(#arrow)"{dashed}/>')
    boxes = []
    for node in flow.nodes:
        x, y = origin(node.id)
        state = (states or {}).get(node.id)
        fill = STATE_COLOURS.get(state or "", "") or KIND_COLOURS.get(node.kind, "#fff")
        subtitle = node.kind + (f": {node.tool or node.agent}" if node.kind in ("tool", "agent") else "")
        title = f"{node.id} ({node.kind}{', ' + state if state else ''})"
        boxes.append(f'<g class="flow-node" data-node="{escape(node.id)}" data-state="{escape(state or "")}" '
                     f'transform="translate({x},{y})"><title>{escape(title)}</title>'
                     f'<rect width="{NODE_W}" height="{NODE_H}" rx="6" fill="{fill}" stroke="#374151"/>'
                     f'{_label(node.id, subtitle)}</g>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="flow-graph" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13" role="img" '
            f'aria-label="Flow graph of {len(flow.nodes)} nodes">'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
            'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#6b7280"/></marker></defs>'
            + "".join(edges) + "".join(boxes) + "</svg>")

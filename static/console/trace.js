// The live run trace: a waterfall of spans, built from the page's backlog, then from
// /ws/runs/<id>/?after=<last seq>. Every event is applied exactly once, in seq order: frames at
// or below the last applied seq are dropped (duplicates), frames beyond the next one wait until
// the gap is filled (the socket is asked to resend from the last seq). On a dropped connection
// the page reconnects with ?after=<last seq>, so nothing is missed or shown twice.
//
// Data from the trace (model output, tool results, arguments) only ever reaches the page via
// textContent or attribute setters: never innerHTML.
(function () {
  "use strict";

  var root = document.getElementById("trace");
  if (!root) return;
  var list = document.getElementById("spans");
  var statusEl = document.getElementById("live-status");
  var countEl = document.getElementById("trace-count");

  var lastSeq = 0;
  var pending = new Map(); // seq -> frame, waiting for a gap to close
  var spans = new Map(); // span id -> {li, children, start, end, kind}
  var rootSpan = null;
  var t0 = null;
  var tLast = null;
  var finished = false;
  var socket = null;
  var toolCalls = readJson("trace-tool-calls") || {};
  var argsFetchTimer = null;
  var layoutQueued = false;
  var eventCount = 0;

  function readJson(id) {
    var el = document.getElementById(id);
    if (!el) return null;
    try { return JSON.parse(el.textContent); } catch (e) { return null; }
  }

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function ms(iso) { var t = Date.parse(iso); return isNaN(t) ? null : t; }

  function fmtMs(value) {
    if (value === null || value === undefined || isNaN(value)) return "";
    return value >= 1000 ? (value / 1000).toFixed(2) + " s" : Math.round(value) + " ms";
  }

  function fmtNum(value) {
    var n = Number(value || 0);
    return isNaN(n) ? "0" : n.toLocaleString("en-US");
  }

  function fmtCost(value) {
    var n = Number(value || 0);
    return isNaN(n) ? "0" : n.toFixed(4);
  }

  function short(value, limit) {
    var text = typeof value === "string" ? value : JSON.stringify(value);
    if (text === undefined) text = "";
    return text.length > limit ? text.slice(0, limit) + "…" : text;
  }

  function setStatus(state, text) {
    if (!statusEl) return;
    statusEl.dataset.state = state;
    statusEl.textContent = text;
  }

  // --- spans --------------------------------------------------------------------------

  function spanNode(spanId) {
    var span = spans.get(spanId);
    if (span) return span;
    var li = el("li", "span placeholder");
    li.dataset.span = spanId;
    li.id = "span-" + spanId; // a flow node's lane links here
    var row = el("div", "row");
    var label = el("div", "label");
    var title = el("span", "title", "…");
    label.appendChild(title);
    var meta = el("span", "meta");
    label.appendChild(meta);
    var lane = el("div", "lane");
    var bar = el("div", "bar");
    lane.appendChild(bar);
    row.appendChild(label);
    row.appendChild(lane);
    li.appendChild(row);
    var details = el("div", "details");
    li.appendChild(details);
    var children = el("ol", "children");
    li.appendChild(children);
    span = { li: li, row: row, title: title, meta: meta, bar: bar, details: details, children: children, start: null, end: null };
    spans.set(spanId, span);
    list.appendChild(li);
    return span;
  }

  function place(span, parentId) {
    // Top level under the run; otherwise inside the parent span's children.
    if (parentId && parentId !== rootSpan && spans.has(parentId) && spans.get(parentId) !== span) {
      spans.get(parentId).children.appendChild(span.li);
    }
  }

  function fillSpan(frame, kind, titleText) {
    var span = spanNode(frame.span_id);
    span.li.classList.remove("placeholder");
    span.li.classList.add("k-" + kind);
    span.li.dataset.seq = String(frame.seq);
    span.li.dataset.type = frame.type;
    span.title.textContent = titleText;
    span.seqTag = span.seqTag || el("span", "seq");
    span.seqTag.textContent = "#" + frame.seq;
    span.row.querySelector(".label").insertBefore(span.seqTag, span.title);
    place(span, frame.parent_span_id);
    return span;
  }

  function timed(span, frame, latencyMs) {
    var end = ms(frame.at);
    var latency = Number(latencyMs);
    span.end = end;
    span.start = end !== null && !isNaN(latency) && latency > 0 ? end - latency : end;
    track(span.start);
    track(span.end);
  }

  function track(t) {
    if (t === null) return;
    if (t0 === null || t < t0) t0 = t;
    if (tLast === null || t > tLast) tLast = t;
  }

  function kv(container, key, value) {
    if (value === undefined || value === null || value === "") return;
    var item = el("span", "kv");
    item.appendChild(el("span", "k", key));
    item.appendChild(el("span", "v", value));
    container.appendChild(item);
  }

  function textBlock(container, label, text) {
    if (text === undefined || text === null || text === "") return;
    var box = el("details", "text-block");
    box.appendChild(el("summary", null, label));
    box.appendChild(el("pre", "text", typeof text === "string" ? text : JSON.stringify(text, null, 2)));
    container.appendChild(box);
  }

  function approvalLink(container, payload) {
    var id = payload && (payload.approval_id || (payload.approval && payload.approval.id));
    if (id === undefined || id === null || id === "") return false;
    var link = el("a", "approval-link", "Open approval " + short(String(id), 40));
    link.setAttribute("href", "/approvals/" + encodeURIComponent(String(id)) + "/");
    container.appendChild(link);
    return true;
  }

  // A point-in-time event (state transition, hook decision, stage...) as its own row.
  function markRow(frame, kind, titleText, parentId) {
    var li = el("li", "event k-" + kind);
    li.dataset.seq = String(frame.seq);
    li.dataset.type = frame.type;
    var row = el("div", "row");
    var label = el("div", "label");
    label.appendChild(el("span", "seq", "#" + frame.seq));
    label.appendChild(el("span", "title", titleText));
    var meta = el("span", "meta");
    label.appendChild(meta);
    var lane = el("div", "lane");
    var bar = el("div", "bar mark");
    lane.appendChild(bar);
    row.appendChild(label);
    row.appendChild(lane);
    li.appendChild(row);
    var details = el("div", "details");
    li.appendChild(details);
    var at = ms(frame.at);
    var latency = Number((frame.payload || {}).latency_ms);
    var record = { li: li, bar: bar, start: !isNaN(latency) && latency > 0 && at !== null ? at - latency : at, end: at };
    track(record.start);
    track(record.end);
    marks.push(record);
    var parent = parentId && parentId !== rootSpan ? spanNode(parentId).children : list;
    parent.appendChild(li);
    return { meta: meta, details: details, li: li };
  }
  var marks = [];

  // --- one event ------------------------------------------------------------------------

  function render(frame) {
    var p = frame.payload || {};
    var type = frame.type;
    var parent = frame.parent_span_id;
    var span, row;
    eventCount += 1;
    if (type === "run.started") {
      rootSpan = frame.span_id;
      span = fillSpan(frame, "run", "agent run");
      span.li.classList.add("root");
      span.start = ms(frame.at);
      track(span.start);
      kv(span.meta, "model", p.model);
      kv(span.meta, "tools", (p.tools || []).length);
      kv(span.meta, "context tokens", p.context_tokens);
      if (p.hooks && p.hooks.length) kv(span.meta, "hooks", p.hooks.join(", "));
      return;
    }
    if (type === "model.call" || type === "model.error") {
      span = fillSpan(frame, "model", (type === "model.error" ? "model error " : "model ") + (p.model || ""));
      timed(span, frame, p.latency_ms);
      span.meta.textContent = "";
      kv(span.meta, "in", fmtNum(p.input_tokens));
      kv(span.meta, "out", fmtNum(p.output_tokens));
      kv(span.meta, "cost", fmtCost(p.cost));
      kv(span.meta, "latency", fmtMs(p.latency_ms));
      kv(span.meta, "finish", p.finish_reason);
      if (p.task) kv(span.meta, "task", p.task);
      var calls = (p.tool_calls || []).map(function (c) { return c && c.name; }).filter(Boolean);
      if (calls.length) kv(span.meta, "tool calls", calls.join(", "));
      if (p.error) textBlock(span.details, "error", p.error);
      textBlock(span.details, "output", p.content);
      addRunUsage(p);
      return;
    }
    if (type === "tool.call") {
      span = fillSpan(frame, "tool", "tool " + (p.tool || ""));
      timed(span, frame, p.latency_ms);
      span.li.dataset.status = p.status || "";
      span.meta.textContent = "";
      kv(span.meta, "status", p.status);
      kv(span.meta, "latency", fmtMs(p.latency_ms));
      span.args = el("span", "args");
      span.meta.appendChild(span.args);
      fillArgs(frame.span_id);
      if (!toolCalls[frame.span_id]) scheduleArgsFetch();
      if (approvalLink(span.details, p)) span.li.classList.add("k-approval");
      textBlock(span.details, "result", p.result);
      return;
    }
    if (type === "state.transition") {
      row = markRow(frame, "state", "state " + (p.from || "?") + " → " + (p.to || "?"), parent);
      kv(row.meta, "reason", p.reason);
      return;
    }
    if (type === "hook.decision" || type === "hook.error") {
      row = markRow(frame, "hook", "hook " + (p.hook || p.position || ""), parent);
      kv(row.meta, "at", p.position);
      if (p.jump_to) kv(row.meta, "jump to", p.jump_to);
      if (p.updates && p.updates.length) kv(row.meta, "updates", p.updates.join(", "));
      kv(row.meta, "reason", p.reason);
      if (p.error) textBlock(row.details, "error", p.error);
      return;
    }
    if (type === "run.finished") {
      row = markRow(frame, "run", "run finished: " + (p.terminal_reason || "?"), parent);
      kv(row.meta, "reason", p.reason);
      if (p.decided_by) kv(row.meta, "by", p.decided_by);
      textBlock(row.details, "output", p.output);
      var rootNode = rootSpan && spans.get(rootSpan);
      if (rootNode) { rootNode.end = ms(frame.at); track(rootNode.end); }
      finishRun(p.terminal_reason);
      return;
    }
    if (type === "tool.stage") {
      row = markRow(frame, "stage", "stage " + (p.stage || "?") + (p.ok === false ? " ✗" : " ✓"), parent);
      if (p.ok === false) row.li.classList.add("failed");
      kv(row.meta, "reason", p.reason);
      if (p.errors) kv(row.meta, "errors", short(p.errors, 200));
      if (p.stage === "approval") {
        // Who decided and with what note (masked server-side), and a link to the request.
        kv(row.meta, "approval", p.approval_status);
        if (p.decided_by) kv(row.meta, "decided by", p.decided_by);
        if (p.decision_note) kv(row.meta, "note", short(p.decision_note, 200));
        approvalLink(row.meta, p);
      }
      return;
    }
    if (type === "tool.audit") {
      // The gateway's audit event carries the masked arguments of its tool call (the parent span).
      if (typeof p.arguments === "string" && parent && !toolCalls[parent]) {
        toolCalls[parent] = { arguments_summary: p.arguments };
        fillArgs(parent);
      }
      row = markRow(frame, "stage", "audit " + (p.status || ""), parent);
      kv(row.meta, "latency", fmtMs(p.latency_ms));
      kv(row.meta, "category", p.category);
      return;
    }
    if (type === "model.attempt") {
      row = markRow(frame, "stage", "attempt " + (p.attempt || "") + " " + (p.target || p.model || ""), parent);
      if (p.outcome && p.outcome !== "ok") row.li.classList.add("failed");
      kv(row.meta, "outcome", p.outcome);
      kv(row.meta, "latency", fmtMs(p.latency_ms));
      kv(row.meta, "price", p.price);  // "demo price": the demo planner's invented price, not a real one
      if (p.error) kv(row.meta, "error", short(p.error, 200));
      return;
    }
    if (type === "planner.plan") {
      row = markRow(frame, "stage", "plan " + (p.phase || ""), parent);
      if (p.intent) kv(row.meta, "intent", [].concat(p.intent).join(", "));
      if (p.calls && p.calls.length) kv(row.meta, "calls", p.calls.map(function (c) { return c && c.name; }).join(", "));
      if (p.missing && p.missing.length) kv(row.meta, "missing", short(p.missing, 120));
      return;
    }
    if (type === "run.needs_attention" || type === "run.attention_resolved") {
      var needs = type === "run.needs_attention";
      row = markRow(frame, "approval", needs ? "needs attention: " + (p.kind || "") : "attention resolved", parent);
      if (needs) row.li.classList.add("failed");
      kv(row.meta, "tool", p.tool);
      kv(row.meta, "call", p.call_id);
      kv(row.meta, "by", p.resolved_by);
      if (p.message) textBlock(row.details, "what to check", p.message);
      showAttention(needs);
      return;
    }
    if (type.indexOf("flow.node.") === 0 && p && typeof p.node === "string") {
      renderFlowNode(frame, p);
      return;
    }
    if (type === "supervisor.route" || type === "supervisor.child_finished") {
      var routed = type === "supervisor.route";
      row = markRow(frame, "run", (routed ? "route → " : "sub-agent finished: ") + (p.agent || "none"), parent);
      if (routed && p.reason === "none") row.li.classList.add("failed");
      if (routed) {
        kv(row.meta, "mode", p.mode);
        kv(row.meta, "why", p.reason);
        kv(row.meta, "rule", p.rule);
        kv(row.meta, "intent", p.intent);
        kv(row.meta, "keyword", p.keyword);
        kv(row.meta, "matched", p.matched);
        kv(row.meta, "choice", p.choice);
        if (p.why) kv(row.meta, "because", p.why);
      } else {
        kv(row.meta, "status", p.terminal_reason || p.status);
      }
      if (typeof p.child_run === "string" && /^[0-9a-f-]{36}$/.test(p.child_run)) {
        var link = el("a", null, "child run " + p.child_run.slice(0, 8));
        link.href = "/console/runs/" + p.child_run + "/";
        row.meta.appendChild(link);
      }
      return;
    }
    // Anything else, including events this page does not know yet: shown generically.
    var kind = type.indexOf("approval") >= 0 || p.approval_id ? "approval" : "other";
    row = markRow(frame, kind, type, parent);
    approvalLink(row.meta, p);
    var shown = {};
    Object.keys(p).forEach(function (key) { if (key !== "type") shown[key] = p[key]; });
    kv(row.meta, "", short(shown, 160));
    textBlock(row.details, "payload", p);
  }

  var usage = { input: 0, output: 0, cost: 0 };
  function addRunUsage(p) {
    usage.input += Number(p.input_tokens || 0);
    usage.output += Number(p.output_tokens || 0);
    usage.cost += Number(p.cost || 0);
  }

  function fillArgs(spanId) {
    var span = spans.get(spanId);
    var call = toolCalls[spanId];
    if (!span || !span.args || !call) return;
    span.args.textContent = "";
    kv(span.args, "args", call.arguments_summary || "(none)");
  }

  function scheduleArgsFetch() {
    if (argsFetchTimer) return;
    argsFetchTimer = setTimeout(function () {
      argsFetchTimer = null;
      fetch(root.dataset.toolCallsUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (body) {
          if (!body || !body.tool_calls) return;
          toolCalls = body.tool_calls;
          Object.keys(toolCalls).forEach(fillArgs);
        })
        .catch(function () { /* arguments are a nicety; the trace stays complete without them */ });
    }, 300);
  }

  // The "needs attention" badge next to the status follows run.needs_attention / run.attention_resolved events.
  function showAttention(needs) {
    var statusCell = document.getElementById("run-status");
    var flag = document.getElementById("run-attention");
    if (!statusCell) return;
    if (needs && !flag) {
      flag = el("span", "badge attention", "needs attention");
      flag.id = "run-attention";
      statusCell.appendChild(document.createTextNode(" "));
      statusCell.appendChild(flag);
    } else if (!needs && flag) {
      flag.remove();
    }
  }

  function finishRun(reason) {
    finished = true;
    root.dataset.status = "finished";
    root.dataset.finished = "true";
    var statusCell = document.getElementById("run-status");
    if (statusCell) {
      var flagged = !!document.getElementById("run-attention");
      statusCell.textContent = "";
      statusCell.appendChild(el("span", "badge status-finished", "finished"));
      if (reason) {
        statusCell.appendChild(document.createTextNode(" "));
        statusCell.appendChild(el("span", "badge reason-" + String(reason).replace(/[^a-z_]/g, ""), reason));
      }
      if (flagged) showAttention(true);
    }
    setStatus("finished", "finished");
    if (socket) socket.close(1000);
  }

  // --- a flow run: the graph's node states and the nodes' lanes ----------------------------
  // Seeded from the server's render (the FlowNodeRun rows), then moved by the flow.node.* events. Node ids are tenant
  // input: they are compared as strings (never put in a selector) and written with textContent / setAttribute.

  var flowSection = document.getElementById("flow");
  var flowGraph = document.getElementById("flow-graph");
  var flowLanes = document.getElementById("flow-lanes");
  var flowKinds = readJson("flow-kinds") || {};
  var flowNodes = new Map(); // node id -> {kind, state, span, start, end}
  var SVG_NS = "http://www.w3.org/2000/svg";
  var LANE_PX = 26;
  var FLOW_STATES = { done: "succeeded" };
  (readJson("flow-spans") || []).forEach(function (s) {
    flowNodes.set(s.node, { kind: s.kind, state: s.state, span: s.span_id, start: ms(s.start), end: s.end ? ms(s.end) : null });
  });

  function setNodeState(nodeId, state) {
    if (!flowGraph) return;
    flowGraph.querySelectorAll(".flow-node").forEach(function (g) {
      if (g.getAttribute("data-node") !== nodeId) return;
      g.setAttribute("data-state", state);
      var title = g.querySelector("title");
      if (title) title.textContent = nodeId + " (" + (flowKinds[nodeId] || "?") + ", " + state + ")";
    });
  }

  function renderFlowNode(frame, p) {
    var nodeId = p.node;
    var type = frame.type;
    var node = flowNodes.get(nodeId) || { kind: p.kind || flowKinds[nodeId] || "", state: "pending", span: "", start: null, end: null };
    var at = ms(frame.at);
    var row;
    if (type === "flow.node.started") {
      node.state = "running";
      node.span = frame.span_id || node.span;
      node.start = at;
      node.end = null;
      var span = fillSpan(frame, "flow", "node " + nodeId);
      span.start = at;
      span.end = null;
      track(at);
      span.meta.textContent = "";
      kv(span.meta, "kind", p.kind);
      kv(span.meta, "attempt", p.attempt);
      if (p.inputs !== undefined) textBlock(span.details, "inputs", p.inputs);
    } else {
      var state = type === "flow.node.skipped" ? "skipped" : type === "flow.node.waiting" ? "waiting"
        : FLOW_STATES[p.status] || p.status || "succeeded";
      node.state = state;
      if (type === "flow.node.finished") node.end = at;
      if (type === "flow.node.waiting" && node.start === null) {
        node.start = at;
        node.span = frame.span_id || frame.parent_span_id || node.span;
      }
      if (type === "flow.node.waiting" && frame.span_id && !frame.parent_span_id) {
        // An approval node: its wait opens the node's span (its finish comes under it once decided).
        var opened = fillSpan(frame, "approval", "node " + nodeId);
        opened.start = at;
        opened.end = null;
        track(at);
        opened.meta.textContent = "";
        kv(opened.meta, "kind", p.kind);
        kv(opened.meta, "status", "waiting");
        approvalLink(opened.meta, p);
        if (p.preview) textBlock(opened.details, "preview", p.preview);
        flowNodes.set(nodeId, node);
        setNodeState(nodeId, node.state);
        drawLanes();
        return;
      }
      var owner = frame.parent_span_id && spans.get(frame.parent_span_id);
      if (owner && type === "flow.node.finished") { owner.end = at; track(at); }
      row = markRow(frame, state === "failed" ? "approval" : "state", type.slice("flow.node.".length) + " " + nodeId, frame.parent_span_id);
      if (state === "failed") row.li.classList.add("failed");
      kv(row.meta, "status", state);
      if (p.approval_id) approvalLink(row.meta, p);
      if (p.chosen) kv(row.meta, "chosen", short(p.chosen, 120));
      if (p.error) textBlock(row.details, "error", p.error);
      if (p.output !== undefined && p.output !== null) textBlock(row.details, "output", p.output);
    }
    flowNodes.set(nodeId, node);
    setNodeState(nodeId, node.state);
    drawLanes();
  }

  function fmtDuration(node) {
    return node.end === null ? "running" : fmtMs(Math.max(node.end - node.start, 0));
  }

  // The same rule as console/flow_view.py lanes(): by start, each node in the first lane whose last node had ended.
  function drawLanes() {
    if (!flowLanes) return;
    var list = [];
    flowNodes.forEach(function (node, id) { if (node.start !== null) list.push({ id: id, node: node }); });
    list.sort(function (a, b) { return a.node.start - b.node.start || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0); });
    var ends = [];
    var first = null;
    var last = null;
    list.forEach(function (item) {
      var lane = -1;
      for (var i = 0; i < ends.length; i++) { if (ends[i] !== null && ends[i] <= item.node.start) { lane = i; break; } }
      if (lane < 0) { lane = ends.length; ends.push(item.node.end); } else { ends[lane] = item.node.end; }
      item.lane = lane;
      if (first === null || item.node.start < first) first = item.node.start;
      var stop = item.node.end === null ? Date.now() : item.node.end;
      if (last === null || stop > last) last = stop;
    });
    var total = Math.max((last || 0) - (first || 0), 1);
    while (flowLanes.firstChild) flowLanes.removeChild(flowLanes.firstChild);
    flowLanes.setAttribute("height", String(Math.max(ends.length, 1) * LANE_PX));
    list.forEach(function (item) {
      var node = item.node;
      var stop = node.end === null ? (last || node.start) : node.end;
      var left = ((node.start - first) / total) * 100;
      var width = Math.max(((stop - node.start) / total) * 100, 0.5);
      var a = document.createElementNS(SVG_NS, "a");
      a.setAttribute("class", "flow-span");
      a.setAttribute("href", "#span-" + encodeURIComponent(node.span || ""));
      a.setAttribute("data-node", item.id);
      a.setAttribute("data-state", node.state);
      a.setAttribute("data-lane", String(item.lane));
      var label = item.id + " · " + (node.kind || "?") + " · " + fmtDuration(node) + " · " + node.state;
      var title = document.createElementNS(SVG_NS, "title");
      title.textContent = label;
      var rect = document.createElementNS(SVG_NS, "rect");
      rect.setAttribute("x", left.toFixed(3) + "%");
      rect.setAttribute("y", String(item.lane * LANE_PX));
      rect.setAttribute("width", width.toFixed(3) + "%");
      rect.setAttribute("height", "22");
      rect.setAttribute("rx", "3");
      var text = document.createElementNS(SVG_NS, "text");
      text.setAttribute("x", left.toFixed(3) + "%");
      text.setAttribute("dx", "4");
      text.setAttribute("y", String(item.lane * LANE_PX + 15));
      text.textContent = label;
      a.appendChild(title);
      a.appendChild(rect);
      a.appendChild(text);
      flowLanes.appendChild(a);
    });
  }

  // --- ordering: apply each seq once, in order -------------------------------------------

  function accept(frame) {
    if (!frame || typeof frame.seq !== "number") return;
    if (frame.seq <= lastSeq || pending.has(frame.seq)) return; // a duplicate
    pending.set(frame.seq, frame);
    var gap = false;
    while (pending.has(lastSeq + 1)) {
      var next = pending.get(lastSeq + 1);
      pending.delete(lastSeq + 1);
      try {
        render(next);
      } catch (e) {
        if (window.console) window.console.error("could not render event", next.seq, e);
      }
      lastSeq = next.seq;
    }
    if (pending.size && socket) {
      gap = true;
      socket.send(JSON.stringify({ after: lastSeq })); // ask for the missing frames again
    }
    root.dataset.lastSeq = String(lastSeq);
    if (countEl) countEl.textContent = "· " + eventCount + " events, last #" + lastSeq + (gap ? " (filling a gap…)" : "");
    queueLayout();
  }

  // --- waterfall layout ---------------------------------------------------------------

  function queueLayout() {
    if (layoutQueued) return;
    layoutQueued = true;
    window.requestAnimationFrame(function () { layoutQueued = false; layout(); });
  }

  function layout() {
    if (t0 === null) return;
    var end = finished ? tLast : Math.max(tLast || t0, Date.now());
    var total = Math.max(end - t0, 1);
    function position(bar, start, stop) {
      if (start === null || start === undefined) return;
      if (stop === null || stop === undefined) stop = end;
      var left = ((start - t0) / total) * 100;
      var width = ((stop - start) / total) * 100;
      bar.style.left = Math.min(Math.max(left, 0), 100).toFixed(3) + "%";
      bar.style.width = Math.max(width, 0.4).toFixed(3) + "%";
      bar.title = fmtMs(stop - start) + " at +" + fmtMs(start - t0);
    }
    spans.forEach(function (span) { position(span.bar, span.start, span.end); });
    marks.forEach(function (mark) { position(mark.bar, mark.start, mark.end); });
  }

  // --- the socket -----------------------------------------------------------------------

  function connect() {
    // Each (re)connect asks for the frames after the last one shown: nothing missed, nothing twice.
    socket = window.liveSocket({
      url: function () { return root.dataset.wsPath + "?after=" + lastSeq; },
      onFrame: accept,
      onStatus: setStatus,
      done: function () { return finished; },
    });
  }

  (readJson("trace-backlog") || []).forEach(accept);
  layout();
  if (!finished) {
    connect();
    setInterval(function () { if (!finished) { queueLayout(); if (flowSection) drawLanes(); } }, 1000); // the open spans grow with time
  } else {
    setStatus("finished", "finished");
  }
})();

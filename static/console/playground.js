// The playground: pick an agent and one of its versions, send a message, watch the run.
// Starting is a session POST with the page's CSRF token; the run is then read from its SSE stream
// (/api/v1/runs/<id>/stream, session auth): message.delta frames grow the answer as the model writes it,
// committed events become steps, and run.finished's output is the final answer (the demo planner sends no
// deltas, so the answer may only come from there). Text from the run only reaches the page via textContent.
(function () {
  "use strict";

  var form = document.getElementById("playground-form");
  if (!form) return;
  var agents = JSON.parse(document.getElementById("pg-agents").textContent);
  var agentSel = document.getElementById("pg-agent");
  var versionSel = document.getElementById("pg-version");
  var errorEl = document.getElementById("pg-error");
  var section = document.getElementById("pg-run");
  var statusEl = document.getElementById("pg-status");
  var traceLink = document.getElementById("pg-trace");
  var answerEl = document.getElementById("pg-answer");
  var stepsEl = document.getElementById("pg-steps");
  var source = null;
  var deltaStep = null;

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function short(value, limit) {
    var text = typeof value === "string" ? value : JSON.stringify(value);
    if (text === undefined) text = "";
    return text.length > limit ? text.slice(0, limit) + "…" : text;
  }

  function fillVersions() {
    var agent = agents.filter(function (a) { return String(a.id) === agentSel.value; })[0];
    versionSel.textContent = "";
    (agent ? agent.versions : []).forEach(function (v) {
      var option = el("option", null, v.label);
      option.value = String(v.id);
      if (v.id === agent.current) option.selected = true;
      versionSel.appendChild(option);
    });
  }
  agentSel.addEventListener("change", fillVersions);
  fillVersions();

  function setStatus(state, text) {
    statusEl.dataset.state = state;
    statusEl.textContent = text;
  }

  function step(kind, title, detail) {
    var li = el("li", "step k-" + kind);
    li.dataset.kind = kind;
    li.appendChild(el("strong", null, title));
    if (detail) li.appendChild(el("span", "muted", " " + detail));
    stepsEl.appendChild(li);
    return li;
  }

  function approvalLink(li, p) {
    var id = p && (p.approval_id || (p.approval && p.approval.id));
    if (!id) return false;
    var link = el("a", "approval-link", "open the approval");
    link.href = "/approvals/" + encodeURIComponent(String(id)) + "/";
    li.appendChild(document.createTextNode(" "));
    li.appendChild(link);
    return true;
  }

  function onDelta(frame) {
    // A new attempt or step restarts the streamed text; offset says where this piece belongs.
    var key = frame.step + ":" + frame.attempt;
    if (deltaStep !== key) { deltaStep = key; answerEl.textContent = ""; answerEl.dataset.state = "streaming"; }
    var text = answerEl.textContent;
    var offset = Number(frame.offset || 0);
    answerEl.textContent = text.slice(0, offset) + (frame.text || "");
    answerEl.dataset.deltas = String(Number(answerEl.dataset.deltas || 0) + 1);
  }

  function onEvent(frame) {
    var p = frame.payload || {};
    var type = frame.type;
    if (type === "model.call") {
      var calls = (p.tool_calls || []).map(function (c) { return c && (c.name || (c["function"] && c["function"].name)); });
      step("model", "model " + (p.model || ""), calls.length ? "→ " + calls.join(", ") : short(p.content || "", 160));
    } else if (type === "tool.call") {
      var li = step("tool", "tool " + (p.tool || ""), p.status || "");
      if (approvalLink(li, p)) li.dataset.kind = "approval";
    } else if (type === "state.transition") {
      if (p.to === "waiting") {
        var wait = step("approval", "waiting for approval", p.reason || "");
        approvalLink(wait, p);
        setStatus("waiting", "waiting for an approval");
      }
    } else if (type === "tool.stage" && p.stage === "approval") {
      var waiting = p.ok === false && (!p.approval_status || p.approval_status === "pending");
      var stage = step("approval", waiting ? "approval waiting" : "approval " + (p.approval_status || ""),
                       waiting ? (p.reason || "") : (p.decided_by ? "by " + p.decided_by : ""));
      approvalLink(stage, p);
    } else if (type === "run.finished") {
      step("run", "run finished: " + (p.terminal_reason || "?"), p.reason || "");
      if (p.output) answerEl.textContent = p.output;
      else if (!answerEl.textContent) answerEl.textContent = p.reason || "(no answer)";
      answerEl.dataset.state = "final";
      setStatus("finished", "finished: " + (p.terminal_reason || "?"));
      if (source) { source.close(); source = null; }
    } else if (type === "run.started") {
      setStatus("running", "running");
    } else if (type.indexOf("approval") >= 0 || p.approval_id) {
      approvalLink(step("approval", type, ""), p);
    }
  }

  function watch(run) {
    if (source) source.close();
    deltaStep = null;
    stepsEl.textContent = "";
    answerEl.textContent = "";
    answerEl.dataset.state = "waiting";
    answerEl.dataset.deltas = "0";
    traceLink.href = run.trace;
    section.hidden = false;
    section.dataset.run = run.id;
    setStatus("queued", "queued (v" + run.version + ")");
    source = new EventSource(run.stream);
    source.onmessage = function (message) {
      var frame;
      try { frame = JSON.parse(message.data); } catch (e) { return; }
      if (frame.type === "message.delta") onDelta(frame); else onEvent(frame);
    };
    // EventSource reconnects by itself with Last-Event-ID: no step is lost or shown twice.
    source.onerror = function () { if (source) setStatus("reconnecting", "reconnecting…"); };
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    errorEl.hidden = true;
    var button = document.getElementById("pg-send");
    button.disabled = true;
    fetch(form.action, {
      method: "POST", body: new FormData(form), credentials: "same-origin",
      headers: { "X-CSRFToken": form.querySelector("[name=csrfmiddlewaretoken]").value, "Accept": "application/json" },
    }).then(function (response) {
      return response.json().catch(function () { return { error: "HTTP " + response.status }; })
        .then(function (body) { return { ok: response.ok, status: response.status, body: body }; });
    }).then(function (result) {
      if (!result.ok) throw new Error(result.body.error || ("HTTP " + result.status));
      watch(result.body);
    }).catch(function (err) {
      errorEl.textContent = String(err.message || err);
      errorEl.hidden = false;
    }).then(function () { button.disabled = false; });
  });
})();

// The run list, live: /ws/console/runs/ sends a row for each committed step of the tenant's runs.
// A known run's row is updated in place; a new run is added on top (first page only) when it
// matches the page's filters; after a reconnect the rows are re-read from the server. Text
// reaches the page through textContent only.
(function () {
  "use strict";

  var body = document.getElementById("runs");
  if (!body || body.dataset.live !== "true") return;
  var statusEl = document.getElementById("live-status");
  var showTenant = body.dataset.showTenant === "true";
  var pageSize = parseInt(body.dataset.pageSize || "50", 10);

  function setStatus(state, text) {
    if (!statusEl) return;
    statusEl.dataset.state = state;
    statusEl.textContent = text;
  }

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function cls(value) { return String(value || "").replace(/[^a-z0-9_-]/gi, ""); }

  function matches(row) {
    var f = body.dataset;
    if (f.filterAgent && String(row.agent_id) !== f.filterAgent) return false;
    if (f.filterVersion && String(row.version_id) !== f.filterVersion) return false;
    if (f.filterUser && String(row.user_id) !== f.filterUser) return false;
    if (f.filterStatus && row.status !== f.filterStatus) return false;
    if (f.filterReason && row.terminal_reason !== f.filterReason) return false;
    if (f.filterAttention && String(row.needs_attention ? 1 : 0) !== f.filterAttention) return false;
    var day = String(row.created_at || "").slice(0, 10);
    if (f.filterDay && day !== f.filterDay) return false;
    if (f.filterSince && day < f.filterSince) return false;
    return true;
  }

  function badge(kind, value) {
    return el("span", "badge " + kind + "-" + cls(value), value);
  }

  function fill(tr, row) {
    tr.dataset.status = row.status;
    function cell(field) { return tr.querySelector('[data-field="' + field + '"]'); }
    var status = cell("status");
    status.textContent = "";
    status.appendChild(badge("status", row.status));
    if (row.playground) {
      var play = el("span", "badge playground", "playground");
      play.title = "Started from the playground";
      status.appendChild(document.createTextNode(" "));
      status.appendChild(play);
    }
    if (row.needs_attention) {
      var flag = el("span", "badge attention", "needs attention");
      flag.title = "An operator must check this run";
      status.appendChild(document.createTextNode(" "));
      status.appendChild(flag);
    }
    var reason = cell("terminal_reason");
    reason.textContent = "";
    if (row.terminal_reason) reason.appendChild(badge("reason", row.terminal_reason));
    cell("step").textContent = String(row.step);
    var tokens = cell("tokens");
    tokens.textContent = row.tokens_text;
    tokens.title = row.input_tokens + " in / " + row.output_tokens + " out";
    cell("cost").textContent = row.cost_text;
    cell("duration").textContent = row.duration_text;
    tr.classList.add("flash");
    setTimeout(function () { tr.classList.remove("flash"); }, 800);
  }

  function build(row) {
    var tr = el("tr");
    tr.dataset.runId = row.id;
    function td(field, className) {
      var cell = el("td", className);
      cell.dataset.field = field;
      tr.appendChild(cell);
      return cell;
    }
    if (showTenant) td("tenant").textContent = row.tenant;
    var link = el("a", null, String(row.id).slice(0, 8) + "…");
    link.setAttribute("href", "/console/runs/" + encodeURIComponent(row.id) + "/");
    link.title = row.input_preview || "";
    td("id").appendChild(link);
    var agentCell = td("agent");
    var agentLink = el("a", null, row.agent);
    agentLink.setAttribute("href", "?agent=" + encodeURIComponent(row.agent_id));
    agentCell.appendChild(agentLink);
    agentCell.appendChild(document.createTextNode(" "));
    agentCell.appendChild(el("span", "muted", "v" + row.version));
    td("status");
    td("terminal_reason");
    td("user").textContent = row.user;
    td("step", "num");
    td("tokens", "num");
    td("cost", "num");
    td("duration", "num");
    var time = el("time", null, row.created_text);
    time.setAttribute("datetime", row.created_at);
    td("created").appendChild(time);
    fill(tr, row);
    return tr;
  }

  function apply(row) {
    var existing = body.querySelector('tr[data-run-id="' + cls(row.id) + '"]');
    if (existing) {
      fill(existing, row);
      return;
    }
    if (!matches(row)) return;
    var empty = body.querySelector("tr.empty");
    if (empty) empty.remove();
    body.insertBefore(build(row), body.firstChild);
    var rows = body.querySelectorAll("tr[data-run-id]");
    for (var i = pageSize; i < rows.length; i++) rows[i].remove();
  }

  // After a reconnect, updates sent while the socket was down are gone: re-read the rows this
  // page shows from the server (server-rendered, escaped HTML of the same URL and filters).
  function resync() {
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("runs");
        if (fresh) body.replaceChildren.apply(body, Array.prototype.slice.call(fresh.childNodes));
      })
      .catch(function () { setStatus("reconnecting", "could not refresh the list; reload the page"); });
  }

  function connect() {
    window.liveSocket({
      url: function () { return body.dataset.wsPath; },
      onOpen: function (reconnected) { if (reconnected) resync(); },
      onFrame: function (data) { if (data && data.type === "run.summary" && data.run) apply(data.run); },
      onStatus: setStatus,
    });
  }

  connect();
})();

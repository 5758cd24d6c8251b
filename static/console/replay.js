// The replay batch page: while the batch runs, poll its progress JSON and reload once it is done (the diffs are
// rendered by the server). Same-origin GET only; no third-party code (the page's CSP allows our static files only).
(function () {
  "use strict";
  var box = document.getElementById("progress");
  if (!box || box.dataset.running !== "true") return;
  var url = box.dataset.url;
  function set(id, value) { var el = document.getElementById(id); if (el) el.textContent = value; }
  function poll() {
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (b) {
        set("batch-status", b.status); set("batch-done", b.done);
        set("batch-passed", b.passed); set("batch-failed", b.failed);
        var bar = document.getElementById("batch-progress"); if (bar) { bar.max = b.total; bar.value = b.done; }
        if (b.status === "queued" || b.status === "running") { setTimeout(poll, 1000); }
        else { window.location.reload(); }
      })
      .catch(function () { setTimeout(poll, 3000); });
  }
  setTimeout(poll, 500);
})();

// The approver inbox: re-render the pending list when a request arrives or is decided elsewhere.
// The list is fetched as server-rendered (escaped) HTML from the same origin; nothing from the
// socket is written into the page as markup.
(function () {
  "use strict";
  var list = document.getElementById("approval-list");
  var status = document.getElementById("live-status");
  if (!list) { return; }
  var fragmentUrl = list.dataset.fragmentUrl;
  var wsPath = list.dataset.wsPath;
  var refreshing = false;
  var again = false;

  function setStatus(state, text) {
    if (!status) { return; }
    status.dataset.state = state;
    status.textContent = text;
  }

  function refresh() {
    if (refreshing) { again = true; return; }
    refreshing = true;
    fetch(fragmentUrl, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString("<div>" + html + "</div>", "text/html");
        list.replaceChildren.apply(list, Array.prototype.slice.call(doc.body.firstChild.childNodes));
      })
      .catch(function () { setStatus("error", "could not refresh; retrying"); })
      .finally(function () {
        refreshing = false;
        if (again) { again = false; refresh(); }
      });
  }

  function connect() {
    window.liveSocket({
      url: function () { return wsPath; },
      onOpen: function () { refresh(); },
      onFrame: function () { refresh(); },
      onStatus: setStatus,
    });
  }

  connect();
}());

// Time left on approval requests, kept current: every [data-seconds-left] element counts down once a second and
// shows the same text the server renders (approvals/timeleft.py): "45 s", "58 min", "1 h 5 min", "2 d 3 h".
(function () {
  "use strict";

  function humanize(seconds) {
    var total = Math.max(0, Math.floor(Number(seconds) || 0));
    if (total < 60) return total + " s";
    var minutes = Math.floor(total / 60);
    if (minutes < 60) return minutes + " min";
    var hours = Math.floor(minutes / 60);
    minutes = minutes % 60;
    if (hours < 24) return minutes ? hours + " h " + minutes + " min" : hours + " h";
    var days = Math.floor(hours / 24);
    hours = hours % 24;
    return hours ? days + " d " + hours + " h" : days + " d";
  }

  // Counted from the moment the element was rendered, so a tab throttled in the background does not drift.
  var seen = new WeakMap();
  function tick() {
    var now = Date.now();
    Array.prototype.forEach.call(document.querySelectorAll("[data-seconds-left]"), function (cell) {
      var start = seen.get(cell);
      if (!start) { start = { at: now, left: parseInt(cell.dataset.secondsLeft, 10) || 0 }; seen.set(cell, start); }
      var left = Math.max(0, start.left - Math.floor((now - start.at) / 1000));
      var text = humanize(left);
      if (cell.textContent !== text) cell.textContent = text;
      cell.title = left + " s";
    });
  }

  window.approvalTimeLeft = humanize;
  tick();
  window.setInterval(tick, 1000);
}());

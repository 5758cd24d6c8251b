// One reconnecting websocket for the console's pages (run list, run trace, approver inbox).
// Reconnects with exponential backoff and full jitter (0.5 s doubling to 15 s), so a server restart is not
// met by every open page at the same instant; the server's heartbeat frames ({"type": "heartbeat",
// "interval": N}) are swallowed here and keep a watchdog fed: when nothing at all arrives for three
// intervals the connection is taken for dead and replaced.
(function () {
  "use strict";
  var BASE_MS = 500;
  var MAX_MS = 15000;
  var CONNECT_TIMEOUT_MS = 10000;

  // opts: url() -> string; onFrame(frame); onOpen(reconnected); onStatus(state, text); done() -> true to stop reconnecting
  window.liveSocket = function (opts) {
    var attempt = 0;
    var openedBefore = false;
    var watchdog = null;
    var socket = null;

    function status(state, text) { if (opts.onStatus) opts.onStatus(state, text); }
    function done() { return opts.done ? opts.done() : false; }

    function feed(intervalSeconds) {
      if (watchdog) window.clearTimeout(watchdog);
      if (!intervalSeconds) return;
      var fed = socket;
      watchdog = window.setTimeout(function () {
        if (fed) { fed.close(); retry(fed); } // dead: replace it (retry ignores a socket already replaced)
      }, intervalSeconds * 3000);
    }

    // Retry once per socket: a browser may report a failed attempt with "error" and never "close" (seen with
    // Chromium on a refused connection), or with both; either way exactly one reconnect is scheduled.
    function retry(failed) {
      if (failed !== socket) return;
      if (watchdog) window.clearTimeout(watchdog);
      socket = null;
      if (done()) return;
      var ceiling = Math.min(MAX_MS, BASE_MS * Math.pow(2, attempt));
      attempt += 1;
      var wait = Math.round(BASE_MS / 2 + Math.random() * ceiling);
      status("reconnecting", "reconnecting…");
      window.setTimeout(connect, wait);
    }

    function connect() {
      if (done()) return;
      var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
      status("connecting", "connecting…");
      var current = new WebSocket(scheme + window.location.host + opts.url());
      socket = current;
      var heartbeat = 0;
      // an attempt that neither opens nor fails (a half-open network) is given up after a while
      watchdog = window.setTimeout(function () {
        if (current.readyState !== WebSocket.OPEN) { current.close(); retry(current); }
      }, CONNECT_TIMEOUT_MS);
      current.onopen = function () {
        if (current !== socket) return;
        if (watchdog) window.clearTimeout(watchdog);
        attempt = 0;
        status("live", "live");
        if (opts.onOpen) opts.onOpen(openedBefore);
        openedBefore = true;
      };
      current.onmessage = function (message) {
        if (current !== socket) return;
        var frame;
        try { frame = JSON.parse(message.data); } catch (e) { return; }
        if (frame && frame.type === "heartbeat") {
          heartbeat = frame.interval || heartbeat;
          feed(heartbeat);
          return;
        }
        feed(heartbeat);
        opts.onFrame(frame);
      };
      current.onerror = function () { retry(current); };
      current.onclose = function () { retry(current); };
    }

    connect();
    return {
      send: function (data) { if (socket && socket.readyState === WebSocket.OPEN) socket.send(data); },
      close: function (code) { if (socket) socket.close(code); }, // reconnects unless done() says otherwise
    };
  };
}());

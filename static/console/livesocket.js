// One reconnecting websocket for the console's pages (run list, run trace, approver inbox).
// Reconnects with exponential backoff and full jitter (0.5 s doubling to 15 s), so a server restart is not
// met by every open page at the same instant; the server's heartbeat frames ({"type": "heartbeat",
// "interval": N}) are swallowed here and keep a watchdog fed: when nothing at all arrives for three
// intervals the connection is taken for dead and replaced.
(function () {
  "use strict";
  var BASE_MS = 500;
  var MAX_MS = 15000;

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
      watchdog = window.setTimeout(function () {
        if (socket) socket.close(); // onclose schedules the reconnect
      }, intervalSeconds * 3000);
    }

    function connect() {
      if (done()) return;
      var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
      status("connecting", "connecting…");
      socket = new WebSocket(scheme + window.location.host + opts.url());
      var heartbeat = 0;
      socket.onopen = function () {
        attempt = 0;
        status("live", "live");
        if (opts.onOpen) opts.onOpen(openedBefore);
        openedBefore = true;
      };
      socket.onmessage = function (message) {
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
      socket.onclose = function () {
        if (watchdog) window.clearTimeout(watchdog);
        socket = null;
        if (done()) return;
        var ceiling = Math.min(MAX_MS, BASE_MS * Math.pow(2, attempt));
        attempt += 1;
        var wait = Math.round(BASE_MS / 2 + Math.random() * ceiling);
        status("reconnecting", "reconnecting…");
        window.setTimeout(connect, wait);
      };
    }

    connect();
    return {
      send: function (data) { if (socket && socket.readyState === WebSocket.OPEN) socket.send(data); },
      close: function (code) { if (socket) socket.close(code); }, // reconnects unless done() says otherwise
    };
  };
}());

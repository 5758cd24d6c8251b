"""The live run list catches up after its socket was down: updates missed meanwhile are re-read."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tests.e2e.test_console_browser import log_in, start_run
from tests.factories import World, make_world


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released). Not a browser-restricted one such as 9 (discard):
    Chromium may leave a socket to a restricted port connecting without ever closing it, so no reconnect follows."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


#: Lets the test cut the page's websockets and keep them from reconnecting (they dial a closed port meanwhile).
CUTTABLE_SOCKETS = """
(() => {
  const Real = window.WebSocket;
  window.__sockets = [];
  window.__blockSockets = false;
  window.WebSocket = function (url, protocols) {
    const socket = new Real(window.__blockSockets ? "ws://127.0.0.1:CLOSED_PORT/" : url, protocols);
    window.__sockets.push(socket);
    return socket;
  };
  window.WebSocket.prototype = Real.prototype;
})();
"""


@pytest.fixture(scope="module")
def resync_world(live_stack: Any, django_db_blocker: Any) -> World:
    with django_db_blocker.unblock():
        return make_world()


def test_a_run_that_started_and_finished_while_the_socket_was_down_appears_after_reconnect(
    page: Any, live_stack: Any, resync_world: World, unblocked_db: None
) -> None:
    page.add_init_script(CUTTABLE_SOCKETS.replace("CLOSED_PORT", str(_closed_port())))
    log_in(page, live_stack, resync_world.operator.username)
    page.wait_for_selector("#live-status[data-state=live]")
    # the socket drops (and cannot reconnect for a while) and a run starts and finishes meanwhile
    page.evaluate("window.__blockSockets = true; window.__sockets.forEach(s => s.close())")
    page.wait_for_selector("#live-status[data-state=reconnecting]", timeout=15_000)
    run_id = start_run(live_stack, resync_world.raw_key)
    live_stack.wait_for_run(resync_world.raw_key, run_id)
    assert page.query_selector(f"tr[data-run-id='{run_id}']") is None
    # back online: the list re-reads its rows, and the finished run is there
    page.evaluate("window.__blockSockets = false")
    row = page.wait_for_selector(f"tr[data-run-id='{run_id}'][data-status=finished]", timeout=20_000)
    assert row is not None
    assert not page.js_errors

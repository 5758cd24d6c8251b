"""core/redis_layer.py: the watched-groups registry, on a real Redis (REDIS_URL), with channels_redis's stock layer.

The publisher (core/live.py) sends a committed step's messages with the layer's public ``group_send``, only to the
groups someone watches; who watches is in keys of our own, announced on a pub/sub channel of our own, and remembered
by each process for ``ttl`` seconds. These pin: a watched group's message arrives; an unwatched group costs no
``group_send`` (and, remembered, no round trip); a join makes every publisher ask again at once; a lost word is
covered once the ttl passed; a killed process's entry expires; a forked child starts clean; Redis down is survived.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from channels_redis.core import RedisChannelLayer

from agents import run_feeds
from core import live, redis_layer
from core.redis_layer import WatchedGroups

REDIS_URL = os.environ.get("REDIS_URL", "")
if not REDIS_URL and os.environ.get("CI", "").lower() == "true":
    raise RuntimeError("CI runs the Redis layer's tests: set REDIS_URL")
pytestmark = pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL (CI sets it)")

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def _layer(url: str = REDIS_URL, **config: Any) -> RedisChannelLayer:
    return RedisChannelLayer(hosts=[{"address": url}], prefix=f"test-{uuid.uuid4().hex[:8]}", **config)


def _registry(url: str = REDIS_URL, **config: Any) -> WatchedGroups:
    return WatchedGroups(url, prefix=f"test-watched-{uuid.uuid4().hex[:8]}", **config)


def _subscribed(registry: WatchedGroups) -> None:
    """Wait until the registry's listener is subscribed (until then nothing is remembered)."""
    deadline = time.monotonic() + 5
    while not registry._subscribed():
        assert time.monotonic() < deadline, "the watched-groups listener never subscribed"
        time.sleep(0.01)


class Sends:
    """What the publisher did: the registry's round trips (its pipelines' commands) and the layer's group sends."""

    def __init__(self, layer: RedisChannelLayer, registry: WatchedGroups | None, patch: pytest.MonkeyPatch) -> None:
        self.round_trips: list[str] = []
        self.group_sends: list[str] = []
        patch.setattr(live, "get_channel_layer", lambda: layer)
        patch.setattr(redis_layer, "registry", lambda: registry)
        if registry is not None:
            pipeline_class = registry.client().pipeline().__class__
            real_execute = pipeline_class.execute

            def counting(pipe: Any, *args: Any, **kwargs: Any) -> Any:
                self.round_trips.append(",".join(str(c[0][0]) for c in pipe.command_stack))
                return real_execute(pipe, *args, **kwargs)

            patch.setattr(pipeline_class, "execute", counting)
        real_group_send = layer.group_send

        async def group_send(group: str, message: dict[str, Any]) -> None:
            self.group_sends.append(group)
            await real_group_send(group, message)

        patch.setattr(layer, "group_send", group_send)

    def send(self, pairs: list[tuple[str, dict[str, Any]]], *, cached: bool = True) -> None:
        """One batch through the publisher, as a committed step's (``cached``) or an approval's; waited for."""
        self.round_trips.clear()
        self.group_sends.clear()
        live._send(pairs, cached=cached)
        assert live.flush()

    @property
    def asked(self) -> list[str]:
        return [r for r in self.round_trips if "ZCOUNT" in r]


async def _drain(layer: RedisChannelLayer, channel: str, count: int, linger: float = 0.3) -> list[dict[str, Any]]:
    got = [await asyncio.wait_for(layer.receive(channel), 5) for _ in range(count)]
    try:
        extra = await asyncio.wait_for(layer.receive(channel), linger)
    except TimeoutError:
        return got
    return [*got, extra]


def test_a_watched_groups_message_arrives_and_an_unwatched_group_costs_no_group_send() -> None:
    layer, registry = _layer(), _registry(ttl=30)
    _subscribed(registry)
    channel = f"watcher-{uuid.uuid4().hex}"
    with pytest.MonkeyPatch.context() as patch:
        sends = Sends(layer, registry, patch)
        asyncio.run(live.join_group(layer, "run.w", channel))
        sends.send([("run.w", {"type": "x.one", "n": 1}), ("nobody", {"type": "x.two", "n": 1})])
        assert sends.group_sends == ["run.w"]  # the unwatched group: not sent at all
        assert len(sends.asked) == 1, sends.round_trips  # both asked in one round trip
        sends.send([("run.w", {"type": "x.one", "n": 2}), ("nobody", {"type": "x.two", "n": 2})])
        assert sends.group_sends == ["run.w"] and sends.asked == []  # remembered: not asked again within the ttl
        assert registry.nobody_in(["nobody"]) and not registry.nobody_in(["run.w"])
        sends.send([("nobody", {"type": "x.two", "n": 3})])
        assert sends.group_sends == [] and sends.round_trips == []  # a step nobody watches costs nothing
    assert asyncio.run(_drain(layer, channel, 2)) == [{"type": "x.one", "n": 1}, {"type": "x.one", "n": 2}]


def test_an_uncached_send_goes_to_every_group_unasked_as_without_a_registry() -> None:
    """Approvals (whose watchers do not resync) and embedded mode (no registry): the layer's group_send, always."""
    layer = _layer()
    channel = f"approver-{uuid.uuid4().hex}"
    asyncio.run(layer.group_add("tenant.1.approvals", channel))
    with pytest.MonkeyPatch.context() as patch:
        sends = Sends(layer, _registry(ttl=30), patch)
        sends.send([("tenant.1.approvals", {"type": "approval.changed", "n": 1})], cached=False)
        assert sends.group_sends == ["tenant.1.approvals"] and sends.round_trips == []
        sends = Sends(layer, None, patch)
        sends.send([("tenant.1.approvals", {"type": "approval.changed", "n": 2}), ("nobody", {"type": "x"})])
        assert sends.group_sends == ["tenant.1.approvals", "nobody"]
        assert not live.unwatched(uuid.uuid4(), 1) and live.resync_after() is None
    assert [m["n"] for m in asyncio.run(_drain(layer, channel, 2))] == [1, 2]


def test_answers_are_read_once_per_ttl_and_a_watcher_whose_word_was_lost_is_sent_to_once_it_has_passed() -> None:
    """Within ``ttl`` of asking, a send asks nothing. A watcher whose join was not announced (the word lost) is sent
    to from the first send after the ttl; its resync (``live.resync_after``) covers the time before."""
    layer, registry = _layer(), _registry(ttl=0.6)
    _subscribed(registry)
    channel = f"late-{uuid.uuid4().hex}"
    with pytest.MonkeyPatch.context() as patch:
        sends = Sends(layer, registry, patch)
        assert live.resync_after() == pytest.approx(0.6 + live.RESYNC_MARGIN_SECONDS)
        sends.send([("run.a", {"type": "x.one", "n": 1}), ("tenant.1.runs", {"type": "x.two", "n": 1})])
        assert len(sends.asked) == 1 and sends.group_sends == []
        asyncio.run(layer.group_add("run.a", channel))
        registry.renew("run.a", channel)  # recorded, but unannounced: as a join whose word was lost
        sends.send([("run.a", {"type": "x.one", "n": 2}), ("tenant.1.runs", {"type": "x.two", "n": 2})])
        assert sends.round_trips == [] and sends.group_sends == []  # within the ttl: not asked, not known yet
        time.sleep(0.7)
        sends.send([("run.a", {"type": "x.one", "n": 3}), ("tenant.1.runs", {"type": "x.two", "n": 3})])
        assert len(sends.asked) == 1 and sends.group_sends == ["run.a"]  # the ttl passed: asked again, then sent
        sends.send([("run.a", {"type": "x.one", "n": 4})])
        assert sends.round_trips == [] and sends.group_sends == ["run.a"]  # remembered as watched: only the send
    assert [m["n"] for m in asyncio.run(_drain(layer, channel, 2))] == [3, 4]


def test_a_join_makes_every_publisher_ask_again_at_once() -> None:
    """``live.join_group`` records the watcher and announces it: each process's listener forgets its answer for that
    group at once, so a new watcher gets the very next step live, not after the ttl."""
    layer, registry = _layer(), _registry(ttl=30)
    _subscribed(registry)
    channel = f"new-{uuid.uuid4().hex}"
    with pytest.MonkeyPatch.context() as patch:
        sends = Sends(layer, registry, patch)
        sends.send([("run.b", {"type": "x.one", "n": 1})])
        assert registry.nobody_in(["run.b"]) and sends.group_sends == []
        asyncio.run(live.join_group(layer, "run.b", channel))
        deadline = time.monotonic() + 5
        while registry.nobody_in(["run.b"]):
            assert time.monotonic() < deadline, "the announcement never reached the listener"
            time.sleep(0.005)
        sends.send([("run.b", {"type": "x.one", "n": 2})])
        assert len(sends.asked) == 1 and sends.group_sends == ["run.b"]
    assert asyncio.run(_drain(layer, channel, 1)) == [{"type": "x.one", "n": 2}]


def test_while_the_listener_is_not_subscribed_nothing_is_remembered() -> None:
    """Without a subscribed listener an announcement could be missed: then every cached send asks."""
    layer, registry = _layer(), _registry(ttl=30)
    _subscribed(registry)
    registry._listening = False  # as while it reconnects
    with pytest.MonkeyPatch.context() as patch:
        sends = Sends(layer, registry, patch)
        asked = 0
        for n in range(3):
            sends.send([("run.c", {"type": "x.one", "n": n})])
            asked += len(sends.asked)
    assert asked == 3 and not registry.nobody_in(["run.c"])


def test_an_entry_not_renewed_within_expiry_does_not_count_and_a_renewal_is_not_announced() -> None:
    """A killed server process never leaves: its entry stops counting ``expiry`` after its last renewal (and the key
    expires). A live one renews without announcing a join, so publishers keep what they remember."""
    registry = _registry(ttl=30, expiry=1)
    _subscribed(registry)
    registry.watch("run.ghost", "ghost")
    registry.watch("run.live", "live")
    assert registry.watched(["run.ghost", "run.live"]) == {"run.ghost", "run.live"}
    time.sleep(0.3)  # the two announcements heard by now: the renewal below must add none
    epoch = registry._epoch
    time.sleep(0.4)
    registry.renew("run.live", "live")
    time.sleep(0.6)  # the ghost's entry is now older than expiry, the live one's is not; a word would have been heard
    assert registry._epoch == epoch, "a renewal was announced as a join"
    registry.forget()
    assert registry.watched(["run.ghost", "run.live"]) == {"run.live"}
    assert registry.client().ttl(registry.key("run.ghost")) <= 1


def test_a_feed_records_its_run_renews_it_and_removes_it_when_its_last_watcher_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """agents/run_feeds.py: one entry per watched run per process (the feed's channel), renewed with the feed's
    membership, gone when it closes; the published step reaches the feed's watcher through the stock layer."""
    layer, registry = _layer(), _registry(ttl=30)
    _subscribed(registry)
    got: list[dict[str, Any]] = []

    class Watcher:
        def deliver(self, message: dict[str, Any]) -> None:
            got.append(message)

        def feed_lost(self) -> None:
            raise AssertionError("the feed failed")

    sends = Sends(layer, registry, monkeypatch)
    monkeypatch.setattr(live, "refresh_every", lambda layer: 0.3)

    async def scenario() -> tuple[float | None, float | None, float | None]:
        watcher = Watcher()
        feed = await run_feeds.join(layer, "run.d", watcher)
        client, key = registry.client(), registry.key("run.d")
        joined = await asyncio.to_thread(client.zscore, key, feed.channel)
        await asyncio.sleep(0.8)  # a renewal or two
        renewed = await asyncio.to_thread(client.zscore, key, feed.channel)
        await asyncio.to_thread(sends.send, [("run.d", {"type": "run.events", "n": 1})])
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.05)
        await run_feeds.leave(feed, watcher)
        return joined, renewed, await asyncio.to_thread(client.zscore, key, feed.channel)

    joined, renewed, after_leaving = asyncio.run(scenario())
    assert joined is not None and renewed is not None and renewed > joined
    assert after_leaving is None
    assert got == [{"type": "run.events", "n": 1}]


def test_nobody_in_says_a_send_would_send_nothing_only_while_that_is_known() -> None:
    """``nobody_in`` (what lets a worker skip framing a step nobody watches: agents/store.py) is True only when every
    group's answer was read less than the ttl ago, was "nobody", and the listener is subscribed; never from a guess."""
    registry = _registry(ttl=0.8)
    groups = ("run.e", "tenant.9.runs")
    assert not registry.nobody_in(groups)  # nothing known yet
    _subscribed(registry)
    assert registry.watched(groups) == set()
    assert registry.nobody_in(groups)
    assert not registry.nobody_in((*groups, "run.unknown"))  # one group not known: not known to be empty
    registry._listening = False  # the listener reconnecting: an announcement could be missed
    assert not registry.nobody_in(groups)
    registry._listening = True
    registry.watch("run.e", f"viewer-{uuid.uuid4().hex}")  # announced: forgotten at once
    deadline = time.monotonic() + 5
    while registry.nobody_in(groups):
        assert time.monotonic() < deadline, "the announced join was never heard"
        time.sleep(0.005)
    registry.watched(["tenant.9.runs"])
    time.sleep(0.9)
    assert not registry.nobody_in(("tenant.9.runs",))  # read longer than the ttl ago: not known any more
    assert not _registry(ttl=0).nobody_in(groups)  # ttl 0: every send asks


def test_what_a_process_remembers_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """One answer per recently published run: past ``MAX_REMEMBERED`` the stale ones are dropped at the next read."""
    registry = _registry(ttl=30)
    _subscribed(registry)
    monkeypatch.setattr(redis_layer, "MAX_REMEMBERED", 5)
    registry.watched([f"run.{n}" for n in range(5)])
    assert len(registry._known) == 5
    registry._known = {group: (when - 60, watched) for group, (when, watched) in registry._known.items()}  # aged
    registry.watched(["run.new"])
    assert set(registry._known) == {"run.new"}


def test_a_forked_child_starts_with_nothing_of_its_parents() -> None:
    """A forked worker process has neither the parent's client nor its listener: it must not trust what the parent
    remembered (no listener of its own hears joins for it yet), and it asks Redis with a client of its own."""
    registry = _registry(ttl=30)
    _subscribed(registry)
    registry.watched(["run.f"])
    assert registry.nobody_in(["run.f"])
    parent_client = registry.client()
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, use of fork() may lead to deadlocks"
        pid = os.fork()
    if pid == 0:  # the child: report, then leave without running anything of the parent's
        try:
            report = [not registry.nobody_in(["run.f"]), registry.client() is not parent_client,
                      registry.watched(["run.f"]) == set()]
            os.write(write, bytes(int(ok) for ok in report))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        report = pipe.read()
    os.waitpid(pid, 0)
    assert list(report) == [1, 1, 1]
    assert registry.nobody_in(["run.f"])  # the parent keeps its own


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_redis(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"redis-server did not start on {port}")


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[int, Path, list[subprocess.Popen[bytes]]]]:
    port = _port()
    procs = [_start_redis(port, tmp_path)]
    yield port, tmp_path, procs
    for proc in procs:  # only the processes this test started
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)


def test_redis_down_is_logged_remembers_nothing_and_sending_resumes_when_it_is_back(
    own_redis: tuple[int, Path, list[subprocess.Popen[bytes]]], caplog: pytest.LogCaptureFixture,
) -> None:
    port, workdir, procs = own_redis
    url = f"redis://127.0.0.1:{port}/0"
    layer, registry = _layer(url), _registry(url, ttl=30, socket_timeout=2, socket_connect_timeout=1)
    _subscribed(registry)
    channel = f"survivor-{uuid.uuid4().hex}"
    with pytest.MonkeyPatch.context() as patch:
        sends = Sends(layer, registry, patch)
        asyncio.run(live.join_group(layer, "run.g", channel))
        sends.send([("run.g", {"type": "x.one", "n": 1}), ("tenant.1.runs", {"type": "x.two", "n": 1})])
        assert sends.group_sends == ["run.g"]
        assert registry.nobody_in(["tenant.1.runs"])
        procs[0].terminate()  # the outage
        procs[0].wait(timeout=10)
        deadline = time.monotonic() + 5
        while registry.nobody_in(["tenant.1.runs"]):  # the listener lost its subscription: nothing is trusted
            assert time.monotonic() < deadline, "the listener never noticed the outage"
            time.sleep(0.02)
        with caplog.at_level(logging.WARNING, logger="core.live"):
            sends.send([("run.g", {"type": "x.one", "n": 2}), ("tenant.1.runs", {"type": "x.two", "n": 2})])
        assert "live publish failed" in caplog.text  # logged; the watchers' feeds fail too and resync from the DB
        with pytest.raises(redis.exceptions.ConnectionError):
            asyncio.run(live.join_group(layer, "run.g", channel))  # a join fails: its socket closes, the client retries
        procs.append(_start_redis(port, workdir))  # back, empty (no persistence): watchers join again
        _subscribed(registry)
        asyncio.run(live.join_group(layer, "run.g", channel))
        # the publisher's first send may meet a connection the outage closed (logged; the watchers resync): the next goes
        sends.send([("run.g", {"type": "x.one", "n": 3}), ("tenant.1.runs", {"type": "x.two", "n": 3})])
        assert sends.group_sends == ["run.g"]
        assert registry.nobody_in(["tenant.1.runs"])  # remembered again
        sends.send([("run.g", {"type": "x.one", "n": 4}), ("tenant.1.runs", {"type": "x.two", "n": 4})])
        assert sends.group_sends == ["run.g"] and sends.round_trips == []
    assert [m["n"] for m in asyncio.run(_drain(layer, channel, 1))][-1:] == [4]

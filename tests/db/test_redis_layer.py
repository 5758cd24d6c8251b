"""core/redis_layer.py: the publisher's synchronous group send delivers exactly what channels_redis's own
``group_send`` delivers, to the stock layer's consumers, on a real Redis (REDIS_URL)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from channels_redis.core import RedisChannelLayer

from core.redis_layer import GROUP_SEND_LUA, RedisLayer

REDIS_URL = os.environ.get("REDIS_URL", "")
if not REDIS_URL and os.environ.get("CI", "").lower() == "true":
    raise RuntimeError("CI runs the Redis layer's tests: set REDIS_URL")
pytestmark = pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL (CI sets it)")


def _layer(**config: Any) -> RedisLayer:
    return RedisLayer(hosts=[{"address": REDIS_URL}], prefix=f"test-{uuid.uuid4().hex[:8]}", **config)


async def _receive(layer: RedisChannelLayer, channel: str, count: int) -> list[dict[str, Any]]:
    return [await asyncio.wait_for(layer.receive(channel), 5) for _ in range(count)]


def _counting(layer: RedisLayer, patch: pytest.MonkeyPatch) -> list[str]:
    commands: list[str] = []
    client = layer._client(0)
    real_execute = client.pipeline().__class__.execute

    def counting(pipe: Any, *args: Any, **kwargs: Any) -> Any:
        commands.append(",".join(str(c[0][0]) for c in pipe.command_stack))
        return real_execute(pipe, *args, **kwargs)

    patch.setattr(client.pipeline().__class__, "execute", counting)
    return commands


def test_the_script_is_channels_redis_own() -> None:
    """An upgrade of channels-redis that changes group_send's script fails here, not in production."""
    assert GROUP_SEND_LUA in inspect.getsource(RedisChannelLayer.group_send)


def test_members_of_each_group_receive_its_messages_in_order_and_an_empty_group_costs_one_round_trip() -> None:
    layer = _layer()

    async def join() -> tuple[str, str]:
        local = await layer.new_channel()  # a process-local channel ("specific.…!…"), as a websocket consumer's
        plain = f"plain-{uuid.uuid4().hex}"
        await layer.group_add("watchers", local)
        await layer.group_add("watchers", plain)
        await layer.group_add("list", plain)
        return local, plain

    local, plain = asyncio.run(join())
    with pytest.MonkeyPatch.context() as patch:
        commands = _counting(layer, patch)
        layer.send_groups([("nobody", {"type": "x.one", "n": 0}), ("nobody.else", {"type": "x.one", "n": 0})])
        assert len(commands) == 1, commands  # nobody watches: one round trip, nothing sent
        commands.clear()
        layer.send_groups([("watchers", {"type": "x.one", "n": 1}), ("list", {"type": "x.two", "n": 2}),
                           ("nobody", {"type": "x.one", "n": 0}), ("watchers", {"type": "x.one", "n": 3})])
        assert len(commands) == 2, commands  # the members, then every message

    async def read() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return await _receive(layer, local, 2), await _receive(layer, plain, 3)

    got_local, got_plain = asyncio.run(read())
    assert got_local == [{"type": "x.one", "n": 1}, {"type": "x.one", "n": 3}]
    assert got_plain == [{"type": "x.one", "n": 1}, {"type": "x.two", "n": 2}, {"type": "x.one", "n": 3}]


def test_a_channel_at_capacity_drops_the_message_as_group_send_does(caplog: pytest.LogCaptureFixture) -> None:
    layer = _layer(capacity=1)
    channel = f"full-{uuid.uuid4().hex}"
    asyncio.run(layer.group_add("g", channel))
    with caplog.at_level(logging.INFO, logger="core.redis_layer"):
        layer.send_groups([("g", {"type": "x.one", "n": 1}), ("g", {"type": "x.one", "n": 2})])
    assert "1 of 1 channels over capacity in group g" in caplog.text

    async def read() -> list[dict[str, Any]]:
        first = await _receive(layer, channel, 1)
        try:
            extra = await asyncio.wait_for(layer.receive(channel), 0.5)
        except TimeoutError:
            return first
        return [*first, extra]

    assert asyncio.run(read()) == [{"type": "x.one", "n": 1}]


def test_an_expired_member_is_dropped_from_its_group_before_the_send() -> None:
    layer = _layer(group_expiry=1)
    channel = f"old-{uuid.uuid4().hex}"
    asyncio.run(layer.group_add("g", channel))
    time.sleep(2.1)
    layer.send_groups([("g", {"type": "x.one", "n": 1})])
    assert layer._client(0).zcard(layer._group_key("g")) == 0


def _subscribed(layer: RedisLayer) -> None:
    """Wait until the layer's members listener is subscribed (until then nothing is remembered)."""
    deadline = time.monotonic() + 5
    while not layer._ensure_listener(0):
        assert time.monotonic() < deadline, "the members listener never subscribed"
        time.sleep(0.01)


async def _drain(layer: RedisLayer, channel: str, count: int) -> list[dict[str, Any]]:
    got = await _receive(layer, channel, count)
    try:
        extra = await asyncio.wait_for(layer.receive(channel), 0.3)
    except TimeoutError:
        return got
    return [*got, extra]


def test_cached_members_are_read_once_per_ttl_and_an_unannounced_member_is_sent_to_once_it_has_passed() -> None:
    """``cached=True``: within ``members_ttl`` of reading a group's members no round trip reads them again (nobody
    watching costs nothing). A member whose join was not announced (the word lost) is sent to from the first send
    after the ttl; its watcher's resync covers the time before. Uncached sends (approvals) always read the members."""
    layer = _layer(members_ttl=0.6)
    _subscribed(layer)
    channel = f"late-{uuid.uuid4().hex}"
    with pytest.MonkeyPatch.context() as patch:
        commands = _counting(layer, patch)
        layer.send_groups([("run.a", {"type": "x.one", "n": 1}), ("tenant.1.runs", {"type": "x.two", "n": 1})], cached=True)
        assert len(commands) == 1, commands  # read once
        asyncio.run(RedisChannelLayer.group_add(layer, "run.a", channel))  # channels_redis's own: no announcement
        commands.clear()
        layer.send_groups([("run.a", {"type": "x.one", "n": 2}), ("tenant.1.runs", {"type": "x.two", "n": 2})], cached=True)
        assert commands == []  # within the ttl: no round trip, and the new member is not known yet
        layer.send_groups([("run.a", {"type": "x.one", "n": 3})])
        assert len(commands) == 2, commands  # uncached: read, then sent to the member
        time.sleep(0.7)
        commands.clear()
        layer.send_groups([("run.a", {"type": "x.one", "n": 4}), ("tenant.1.runs", {"type": "x.two", "n": 4})], cached=True)
        assert len(commands) == 2, commands  # the ttl passed: read again, then sent
        commands.clear()
        layer.send_groups([("run.a", {"type": "x.one", "n": 5})], cached=True)
        assert len(commands) == 1 and "ZRANGE" not in commands[0], commands  # members as read: only the send

    assert asyncio.run(_drain(layer, channel, 3)) == [{"type": "x.one", "n": 3}, {"type": "x.one", "n": 4},
                                                        {"type": "x.one", "n": 5}]


def test_a_join_announced_by_group_add_makes_the_next_cached_send_read_the_members_again() -> None:
    """The layer's ``group_add`` tells every publisher's listener (Redis pub/sub): the remembered members of that
    group are forgotten at once, so a new watcher gets the very next step live, not after the ttl."""
    layer = _layer(members_ttl=30)
    _subscribed(layer)
    channel = f"new-{uuid.uuid4().hex}"
    layer.send_groups([("run.b", {"type": "x.one", "n": 1})], cached=True)
    assert "run.b" in layer._members
    asyncio.run(layer.group_add("run.b", channel))
    deadline = time.monotonic() + 5
    while "run.b" in layer._members:
        assert time.monotonic() < deadline, "the announcement never reached the listener"
        time.sleep(0.005)
    layer.send_groups([("run.b", {"type": "x.one", "n": 2})], cached=True)
    assert asyncio.run(_drain(layer, channel, 1)) == [{"type": "x.one", "n": 2}]


def test_while_the_listener_is_not_subscribed_nothing_is_remembered() -> None:
    """Without a subscribed listener an announcement could be missed: then every cached send reads the members."""
    layer = _layer(members_ttl=30)
    _subscribed(layer)
    layer._listening[0] = False  # as while it reconnects
    with pytest.MonkeyPatch.context() as patch:
        commands = _counting(layer, patch)
        for n in range(3):
            layer.send_groups([("run.c", {"type": "x.one", "n": n})], cached=True)
    assert len(commands) == 3 and "run.c" not in layer._members


def test_a_feed_renews_its_membership_unannounced_and_a_killed_processs_member_expires() -> None:
    """agents/run_feeds.py: a live feed renews its membership every third of ``group_expiry`` (without announcing a
    join: the publishers keep what they remember); a member nobody renews (a server process killed without leaving)
    is dropped at the next send instead of being sent every step for a day."""
    from agents import run_feeds

    layer = _layer(group_expiry=3, members_ttl=30)
    _subscribed(layer)
    ghost = f"ghost-{uuid.uuid4().hex}"
    got: list[dict[str, Any]] = []

    class Watcher:
        def deliver(self, message: dict[str, Any]) -> None:
            got.append(message)

        def feed_lost(self) -> None:
            raise AssertionError("the feed failed")

    async def scenario() -> int:
        await RedisChannelLayer.group_add(layer, "run.d", ghost)
        watcher = Watcher()
        feed = await run_feeds.join(layer, "run.d", watcher)
        await asyncio.sleep(0.3)  # the join's own announcement heard by now: renewals must add none
        epoch = layer._epoch
        await asyncio.sleep(3.5)  # past group_expiry: the ghost's join time is older, the feed's was renewed
        assert layer._epoch == epoch, "a renewal was announced as a join"
        await asyncio.to_thread(layer.send_groups, [("run.d", {"type": "run.events", "n": 1})])
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.05)
        members = await asyncio.to_thread(layer._client(0).zrange, layer._group_key("run.d"), 0, -1)
        await run_feeds.leave(feed, watcher)
        return len(members)

    assert asyncio.run(scenario()) == 1  # the feed's channel only
    assert got == [{"type": "run.events", "n": 1}]


def test_a_member_is_dropped_as_soon_as_it_is_older_than_group_expiry_not_up_to_a_second_later() -> None:
    """The expiry cut-off is not truncated to whole seconds (which kept a member up to 1 s past ``group_expiry`` and made
    the renewal test above flaky): with the clock at .05 past a second, a member 3.02 s old in a 3 s group is gone."""
    from core import redis_layer

    layer = _layer(group_expiry=3)
    now = float(int(time.time())) + 0.05
    key = layer._group_key("run.e")
    layer._client(0).zadd(key, {"old-one": now - 3.02, "young-one": now - 2.9})
    with pytest.MonkeyPatch.context() as patch:  # the layer's clock only, not the process's
        patch.setattr(redis_layer, "time", SimpleNamespace(time=lambda: now, monotonic=time.monotonic, sleep=time.sleep))
        layer.send_groups([("run.e", {"type": "x.one", "n": 1})])
    assert layer._client(0).zrange(key, 0, -1) == [b"young-one"]


def test_nobody_in_says_a_cached_send_would_send_nothing_only_while_that_is_known() -> None:
    """``nobody_in`` (what lets a worker skip framing a step nobody watches: agents/store.py) is True only when every
    group's members were read less than the ttl ago, were none, and the listener is subscribed; never from a guess."""
    layer = _layer(members_ttl=0.8)
    groups = ("run.e", "tenant.9.runs")
    assert not layer.nobody_in(groups)  # nothing known yet
    _subscribed(layer)
    layer.send_groups([(group, {"type": "x.one"}) for group in groups], cached=True)
    assert layer.nobody_in(groups)
    assert not layer.nobody_in((*groups, "run.unknown"))  # one group not known: not known to be empty
    layer._listening[0] = False  # the listener reconnecting: an announcement could be missed
    assert not layer.nobody_in(groups)
    layer._listening[0] = True
    asyncio.run(layer.group_add("run.e", f"viewer-{uuid.uuid4().hex}"))  # announced: forgotten at once
    deadline = time.monotonic() + 5
    while layer.nobody_in(groups):
        assert time.monotonic() < deadline, "the announced join was never heard"
        time.sleep(0.005)
    layer.send_groups([("tenant.9.runs", {"type": "x.one"})], cached=True)
    time.sleep(0.9)
    assert not layer.nobody_in(("tenant.9.runs",))  # read longer than the ttl ago: not known any more

"""Issue #50: a worker holding unacknowledged messages survives a Redis outage (kombu #582/#970, celery #9250).

Reproduced at kombu's level against a redis-server of the test's own: two channels each hold an unacknowledged
message, Redis stops, the connection is collected as Celery's consumer does after a connection loss, and the
channel left open is closed. Without config/broker_patch.py kombu 5.7.0 raises AttributeError there ('NoneType'
object has no attribute 'hostname'), which Celery treats as unrecoverable: the worker exits."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest

from config import broker_patch

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(port: int, workdir: Path) -> subprocess.Popen[bytes]:
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
    procs = [_start(port, tmp_path)]
    yield port, tmp_path, procs
    for proc in procs:  # only the processes this test started
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)


def test_the_patch_is_fenced_to_the_kombu_it_was_written_for() -> None:
    assert kombu.__version__ in broker_patch.AFFECTED, (
        f"kombu is now {kombu.__version__}: check whether kombu #970 is fixed there, then widen or drop "
        "config/broker_patch.py and this test")
    assert broker_patch.apply()


def _unacked_through_an_outage(port: int, procs: list[subprocess.Popen[bytes]]) -> tuple[kombu.Queue, list, list]:
    """Two channels each holding an unacknowledged message; then Redis stops and the connection is collected, as
    Celery's consumer does with a lost connection. Returns the queue, the channels and their messages."""
    assert broker_patch.apply()
    conn = kombu.Connection(f"redis://127.0.0.1:{port}/0")
    queue = kombu.Queue("blip", routing_key="blip")
    with conn.Producer() as producer:
        for n in range(4):
            producer.publish({"n": n}, routing_key="blip", declare=[queue])
    channels, messages = [], []
    for _ in range(2):
        channel = conn.channel()
        messages.append(queue(channel).get(no_ack=False))  # delivered, not acknowledged
        channels.append(channel)
    assert all(message is not None for message in messages)
    procs[0].terminate()  # the outage
    procs[0].wait(timeout=10)
    conn.collect()
    return queue, channels, messages


def test_closing_a_channel_with_unacked_messages_after_the_connection_was_lost_raises_nothing(own_redis: tuple) -> None:
    port, workdir, procs = own_redis
    queue, channels, _ = _unacked_through_an_outage(port, procs)
    for channel in channels:
        channel.close()  # kombu 5.7.0 unpatched: AttributeError: 'NoneType' object has no attribute 'hostname'
    procs.append(_start(port, workdir))  # Redis is back: a new connection works as before
    with kombu.Connection(f"redis://127.0.0.1:{port}/0") as again, again.Producer() as producer:
        producer.publish({"n": "after"}, routing_key="blip", declare=[queue])
        assert queue(again.channel()).get(no_ack=True) is not None


def test_a_task_acknowledging_on_a_channel_closed_with_the_lost_connection_raises_nothing(own_redis: tuple) -> None:
    # bench/faults.py, a worker's log: "Unrecoverable error: AttributeError('NoneType' object has no attribute
    # 'client')" from kombu's Redis QoS.ack, when a task that ran through the outage finished on its closed channel
    port, _, procs = own_redis
    _, channels, messages = _unacked_through_an_outage(port, procs)
    for channel in channels:
        channel.close()
    late = messages[1]  # its channel was closed without reaching Redis: kombu 5.7.0 raised AttributeError here
    late.ack()
    assert late.acknowledged


def test_a_worker_on_redis_applies_the_patch_when_it_starts(monkeypatch: pytest.MonkeyPatch, settings: object) -> None:
    from config import celery as celery_app
    from config import dbroles

    monkeypatch.setattr(dbroles, "use_worker_timeouts", lambda: None)
    monkeypatch.setattr(broker_patch, "_applied", False)
    applied: list[bool] = []
    monkeypatch.setattr(broker_patch, "apply", lambda: applied.append(True) or True)
    settings.EMBEDDED = True  # type: ignore[attr-defined]
    celery_app._worker_init()
    assert applied == []  # the embedded worker is on the in-memory broker: redis-py (and its SDK) stays unloaded
    settings.EMBEDDED = False  # type: ignore[attr-defined]
    celery_app._worker_init()
    assert applied == [True]

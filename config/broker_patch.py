"""A fenced patch for a kombu bug that makes a Celery worker exit after a Redis blip (kombu 5.7.0).

The bug (kombu #582, #970; celery #9250): when the broker connection is lost, the consumer collects the connection.
Closing its first channel tries to give the unacknowledged messages back to Redis, which is down, so the connection
error ends the collection early; the connection's transport then drops its client (``transport.client = None``), and
the channels not yet closed still hold unacknowledged messages. When Celery later closes one of them, kombu's Redis
``QoS.restore_unacked`` builds a client from ``connection.client.hostname`` and raises ``AttributeError`` — not a
connection error, so Celery treats it as unrecoverable and the worker exits with code 1 (seen in bench/faults.py:
both workers exited on a 5 s outage).

The same torn-down channel fails again when a task that was running finishes and acknowledges (or rejects) its
message on it: kombu's Redis ``QoS.ack`` builds a client from the closed channel's ``connection.client`` and raises
``AttributeError: 'NoneType' object has no attribute 'client'`` (bench/faults.py: workers exited on Redis outages
kept and emptied).

The patch: a channel whose connection has been torn down restores, acknowledges and rejects nothing through it,
forgets the delivery in this process and logs it. Nothing is lost:
the messages stay in Redis's unacked index (when Redis kept its data), where any live consumer's ``restore_visible``
puts them back after the visibility timeout; and sooner than that, the run sweeper and the replay sweeper re-enqueue
the work whose lease expired (agents/sweeper.py, releases/sweeper.py), which the leases make safe to run once.

Fenced: applied only to the kombu version it was written and tested for (``AFFECTED``); on any other version it is not
applied and ``tests/integration/test_broker_blip.py`` fails, so an upgrade re-checks the bug upstream.
"""

from __future__ import annotations

import logging
from typing import Any

import kombu

log = logging.getLogger(__name__)

AFFECTED = frozenset({"5.7.0"})
_applied = False


def apply() -> bool:
    """Patch kombu's Redis QoS once, if this kombu is the one the patch is for. True when the patch is in place."""
    global _applied
    if _applied:
        return True
    if kombu.__version__ not in AFFECTED:
        return False
    from kombu.transport import redis as kombu_redis

    original = kombu_redis.QoS.restore_unacked

    def restore_unacked(self: Any, client: Any = None) -> Any:
        connection = self.channel.connection
        if client is None and (connection is None or connection.client is None):
            log.warning("broker connection torn down with %d unacknowledged message(s) on a channel: left in Redis's "
                        "unacked index for restore_visible and the sweepers (kombu #970)", len(self._delivered))
            self._delivered.clear()
            return None
        return original(self, client)

    def torn_down(qos: Any) -> bool:
        connection = qos.channel.connection
        return connection is None or connection.client is None

    base_ack = kombu_redis.QoS.__mro__[1].ack  # the virtual transport's: forgets the delivery in this process only
    original_ack, original_reject = kombu_redis.QoS.ack, kombu_redis.QoS.reject

    def ack(self: Any, delivery_tag: Any) -> Any:
        # A task that finished after its channel was closed with the lost connection: Redis cannot be told through
        # it (kombu built a client from connection.client and raised AttributeError; the worker exited). The
        # message stays in the unacked index; a redelivery finds its run finished (the run's lease decides).
        if torn_down(self):
            log.warning("ack of delivery %s on a channel closed with the lost broker connection: left to the "
                        "unacked index (kombu #970)", delivery_tag)
            return base_ack(self, delivery_tag)
        return original_ack(self, delivery_tag)

    def reject(self: Any, delivery_tag: Any, requeue: bool = False) -> Any:
        if torn_down(self):
            log.warning("reject of delivery %s on a channel closed with the lost broker connection: left to the "
                        "unacked index (kombu #970)", delivery_tag)
            return base_ack(self, delivery_tag)
        return original_reject(self, delivery_tag, requeue=requeue)

    kombu_redis.QoS.restore_unacked = restore_unacked
    kombu_redis.QoS.ack = ack
    kombu_redis.QoS.reject = reject
    _applied = True
    return True

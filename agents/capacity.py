"""A tenant's bound on running work (issue #49): its agent runs being executed plus its flow nodes running.

A tenant has at most :func:`bound` of those at once: its own ``Tenant.max_running``, else ``TENANT_MAX_RUNNING``
(default 3, below a worker's 4 slots, so one tenant alone never takes a whole worker). The count is derived from the
lease rows, never kept in a counter that could leak: a run counts while a worker holds its live lease, a node while
its row is running with a live lease. A killed worker's place is free again when its lease expires.

Admission is decided under the tenant's row lock (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's IMMEDIATE
transactions serialize writers), the lock the flow runner decides its node starts under (``flows/runner.py``; ``flows/store.py``
counts the tenant's runs here too), so two workers never both take the tenant's last place.

A run over its tenant's bound is parked, not failed: its task ends at once and puts it back on the queue in
``TENANT_PARK_SECONDS``, doubling each time it is parked again up to ``TENANT_PARK_MAX_SECONDS`` (a tenant with many
runs parked still looks for a free place often, one of them every max / parked seconds, and its looks do not take the
worker slots other tenants' runs need: at 0.5 s flat they did, bench/fairness.py). The run stays as it was (queued, or
running with a dead lease) and its row is marked so the sweeper leaves it to those retries as long as they come
(``agents/sweeper.py`` takes it back when they stop).

The order this gives: the queue is first come, first served; a parked task frees its worker slot at once and goes to
the back of the queue, so the other tenants' tasks behind it are not held up, and a saturating tenant holds at most its
bound of a worker's slots. Within a tenant a parked run takes the first place free when it looks, not strictly in
arrival order.

Nested work runs in its parent's place and is not admitted again: a sub-agent's child run (``agents/child_runs.py``)
and a flow's agent node's child run (``execute_run(..., in_place=True)``). They still count while they run, so a tenant
nesting runs gets fewer places, never more.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.conf import settings

from agents.models import AgentKind, Run, RunStatus
from core import slots

#: (tenant_id, now) -> the tenant's flow nodes running with a live lease; registered by the flows app above
#: (``FlowsConfig.ready()``): agents imports nothing from flows (see .importlinter).
_node_counter: Callable[[Any, dt.datetime], int] | None = None
slots.declare("agents.capacity", "flows", lambda: ["the running-node counter"] if _node_counter is None else [])


def register_node_counter(counter: Callable[[Any, dt.datetime], int]) -> None:
    global _node_counter
    _node_counter = counter


def bound(tenant: Any) -> int:
    """The tenant's bound on running work: its own, else the deployment's."""
    own = getattr(tenant, "max_running", None)
    return int(own) if own else int(settings.TENANT_MAX_RUNNING)


def running_runs(tenant_id: Any, now: dt.datetime, *, exclude: Any = None) -> int:
    """The tenant's agent runs a worker executes now (a live lease). Flow runs are not counted: their nodes are."""
    runs = Run.objects.filter(tenant_id=tenant_id, status=RunStatus.RUNNING, lease_expires_at__gte=now).exclude(
        lease_token="").exclude(agent__kind=AgentKind.FLOW)
    if exclude is not None:
        runs = runs.exclude(pk=exclude)
    return runs.count()


def running_work(tenant_id: Any, now: dt.datetime, *, exclude: Any = None) -> int:
    """The tenant's running runs and flow nodes. Count it under the tenant's row lock to decide a start."""
    nodes = _node_counter(tenant_id, now) if _node_counter is not None else 0
    return running_runs(tenant_id, now, exclude=exclude) + nodes

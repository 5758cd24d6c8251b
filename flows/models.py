"""A flow run's node states: one row per node that was decided (run, skipped, failed...), the source of truth."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import models

from tenants.scoping import TenantOwned, TenantScopedQuerySet


class NodeStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"


class FlowNodeRun(TenantOwned):
    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="flow_nodes")
    node_id = models.CharField(max_length=63)
    kind = models.CharField(max_length=16)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.PENDING)
    attempt = models.PositiveSmallIntegerField(default=0)
    inputs = models.JSONField(default=dict, blank=True)
    output = models.JSONField(null=True, blank=True)
    chosen = models.JSONField(default=list, blank=True, help_text="A switch's chosen nodes.")
    error = models.TextField(blank=True)
    span_id = models.CharField(max_length=32, blank=True)
    # The node's lease: the task running it (a token) until when; an expired lease on a running node = its worker died.
    lease_token = models.CharField(max_length=32, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    child_run = models.ForeignKey("agents.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["run", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "node_id"], name="flow_node_once_per_run")]
        indexes = [models.Index(fields=["tenant", "status"])]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.node_id} {self.status}"


def live_nodes(tenant_id: Any, now: dt.datetime) -> int:
    """The tenant's nodes running with a live lease (agents/capacity.py counts them against its bound)."""
    return FlowNodeRun.objects.filter(tenant_id=tenant_id, status=NodeStatus.RUNNING, lease_expires_at__gte=now).count()

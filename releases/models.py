"""Release safety (issue #16): evaluation sets of recorded runs, frozen when created, and replay batches that run a
candidate version on them (``releases/replay.py``) with per-run diffs against the recording."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from tenants.scoping import TenantOwned, TenantScopedQuerySet


class EvaluationSet(TenantOwned):
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    agent = models.ForeignKey("agents.Agent", on_delete=models.CASCADE, related_name="evaluation_sets")
    filters = models.JSONField(default=dict, blank=True, help_text="What the runs were chosen by (for display).")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="evaluation_set_name_per_tenant")]

    def __str__(self) -> str:
        return self.name


class EvaluationSetRun(TenantOwned):
    """A member of a set, fixed at creation (a run erased later stays a member and is reported as erased)."""

    evaluation_set = models.ForeignKey(EvaluationSet, on_delete=models.CASCADE, related_name="members")
    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="+")
    position = models.PositiveIntegerField()

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["evaluation_set", "position"]
        constraints = [models.UniqueConstraint(fields=["evaluation_set", "run"], name="evaluation_set_run_once")]


class ModelMode(models.TextChoices):
    RECORDED = "recorded"
    LIVE = "live"


class MissPolicy(models.TextChoices):
    STOP = "stop"
    LIVE_READ = "live_read"


class BatchStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ReplayBatch(TenantOwned):
    evaluation_set = models.ForeignKey(EvaluationSet, on_delete=models.CASCADE, related_name="batches")
    candidate = models.ForeignKey("agents.AgentVersion", on_delete=models.CASCADE, related_name="+")
    model_mode = models.CharField(max_length=16, choices=ModelMode.choices, default=ModelMode.RECORDED)
    miss_policy = models.CharField(max_length=16, choices=MissPolicy.choices, default=MissPolicy.STOP)
    checks = models.JSONField(default=list, blank=True)
    cost_cap = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True,
                                   help_text="Live mode: the most the batch's model calls may cost.")
    concurrency = models.PositiveSmallIntegerField(default=2)
    status = models.CharField(max_length=16, choices=BatchStatus.choices, default=BatchStatus.QUEUED, db_index=True)
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    passed_count = models.PositiveIntegerField(default=0)
    failed_count = models.PositiveIntegerField(default=0)
    pass_rate = models.FloatField(null=True, blank=True)
    cost_spent = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "replay batches"

    def __str__(self) -> str:
        return f"replay {self.pk} of {self.evaluation_set_id} on v{self.candidate_id}"


class ReplayRun(TenantOwned):
    batch = models.ForeignKey(ReplayBatch, on_delete=models.CASCADE, related_name="results")
    source_run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="+")
    position = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, default="replayed")  # replayed | error | skipped
    passed = models.BooleanField(null=True)
    regression = models.BooleanField(default=False)
    diff = models.JSONField(default=dict, blank=True)
    check_results = models.JSONField(default=list, blank=True)
    live_tool_calls = models.PositiveIntegerField(default=0)
    tokens = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    latency_ms = models.FloatField(default=0)
    error = models.TextField(blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["batch", "position"]
        constraints = [models.UniqueConstraint(fields=["batch", "source_run"], name="replay_run_once_per_batch")]


class ReplayShard(models.Model):
    """One shard of a batch as a durable job: a worker leases it before replaying, renews the lease per replayed run and
    fences each chunk's commit with it; the sweeper (``releases/sweeper.py``) re-enqueues a shard whose lease expired
    (its worker died) or that was never leased (its message was lost), so a killed worker's shard resumes within a
    sweep interval instead of the broker's visibility timeout."""

    batch = models.ForeignKey(ReplayBatch, on_delete=models.CASCADE, related_name="shards")
    shard = models.PositiveSmallIntegerField()
    shards = models.PositiveSmallIntegerField()
    lease_token = models.CharField(max_length=32, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    swept_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["batch", "shard"], name="replay_shard_once_per_batch")]
        indexes = [models.Index(fields=["finished_at", "lease_expires_at"], name="replay_shard_open")]

    def __str__(self) -> str:
        return f"shard {self.shard}/{self.shards} of replay {self.batch_id}"

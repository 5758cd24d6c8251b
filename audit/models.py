"""Append-only audit: one row per tool call, and one per configuration change."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from tenants.scoping import TenantOwned, TenantScopedQuerySet


class AppendOnly(models.Model):
    """Rows are written once. Updating or deleting one through the ORM is refused."""

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.pk is not None and not kwargs.pop("_allow_update", False):
            raise PermissionError(f"{type(self).__name__} rows are append-only.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise PermissionError(f"{type(self).__name__} rows are append-only.")


class ToolCallStatus(models.TextChoices):
    STARTED = "started", "Started"
    OK = "ok", "OK"
    ERROR = "error", "Error"
    TIMEOUT = "timeout", "Timeout"
    DENIED = "denied", "Denied"
    INVALID = "invalid", "Invalid arguments"
    DUPLICATE_BLOCKED = "duplicate_blocked", "Duplicate blocked"
    PENDING_APPROVAL = "pending_approval", "Pending approval"
    REJECTED = "rejected", "Rejected"
    EGRESS_DENIED = "egress_denied", "Egress denied"
    OUTCOME_UNKNOWN = "outcome_unknown", "Outcome unknown"
    RATE_LIMITED = "rate_limited", "Rate limited"


class ToolCallAudit(AppendOnly, TenantOwned):
    run = models.ForeignKey("agents.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="tool_audits")
    agent = models.ForeignKey("agents.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    version = models.ForeignKey("agents.AgentVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    session = models.ForeignKey("agents.Session", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    api_key = models.ForeignKey("tenants.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    step = models.PositiveIntegerField(default=0)
    call_id = models.CharField(max_length=100)
    # Every id the model gave this call, first attempt first: a resumed step gets a new id from the model,
    # and the message log holds the last one. Join the transcript on any of them.
    attempt_call_ids = models.JSONField(default=list, blank=True)
    span_id = models.CharField(max_length=32, blank=True)
    tool_name = models.CharField(max_length=200)
    arguments_summary = models.TextField(blank=True, help_text="Masked.")
    arguments_hash = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=24, choices=ToolCallStatus.choices)
    error = models.TextField(blank=True)
    latency_ms = models.PositiveIntegerField(default=0)
    result_size = models.PositiveIntegerField(default=0)
    idempotency_key = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # The tamper-evident chain, per tenant, in the order rows reached their final status.
    chain_seq = models.PositiveBigIntegerField(null=True, blank=True, editable=False)
    prev_hash = models.CharField(max_length=64, blank=True, editable=False)
    row_hash = models.CharField(max_length=64, blank=True, editable=False)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"]), models.Index(fields=["run", "step"])]
        constraints = [models.UniqueConstraint(fields=["tenant", "chain_seq"], name="audit_chain_seq_unique_per_tenant")]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.status} (run {self.run_id}, step {self.step})"


class ConfigChange(AppendOnly):
    """Who changed what configuration, written by the service that made the change."""

    tenant = models.ForeignKey("tenants.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    action = models.CharField(max_length=100)
    target_type = models.CharField(max_length=100, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    target_repr = models.CharField(max_length=300, blank=True)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # The tamper-evident chain: per tenant, and one for platform changes (no tenant), in the order rows were written.
    chain = models.CharField(max_length=32, default="", editable=False)
    chain_seq = models.PositiveBigIntegerField(null=True, blank=True, editable=False)
    prev_hash = models.CharField(max_length=64, blank=True, editable=False)
    row_hash = models.CharField(max_length=64, blank=True, editable=False)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["chain", "chain_seq"], name="config_change_chain_seq_unique")]

    def __str__(self) -> str:
        return f"{self.action} {self.target_repr}"


class AuditChainHead(models.Model):
    """The last sealed audit row of a tenant: locked while a step appends to the chain."""

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.CASCADE, primary_key=True, related_name="+")
    seq = models.PositiveBigIntegerField(default=0)
    hash = models.CharField(max_length=64, default="")

    def __str__(self) -> str:
        return f"audit chain of tenant {self.tenant_id} at {self.seq}"


class ConfigChainHead(models.Model):
    """The last configuration change of a chain (``tenant:<id>`` or ``platform``): locked while a change is appended."""

    chain = models.CharField(max_length=32, primary_key=True)
    seq = models.PositiveBigIntegerField(default=0)
    hash = models.CharField(max_length=64, default="")

    def __str__(self) -> str:
        return f"configuration chain {self.chain} at {self.seq}"

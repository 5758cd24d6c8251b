"""Approval requests (a sensitive tool call waiting for people) and the decisions on them.

The tables were made by the tools app (migration tools 0003) and keep their names; the models moved here with the
rest of the approvals (issue #12), in state only (approvals 0001, tools 0005).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from tenants.scoping import TenantOwned, TenantScopedQuerySet


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


class ApprovalRequest(TenantOwned):
    """A sensitive tool call waiting for a person. Exactly one per tool call, even if the step is replayed."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="approvals")
    step = models.PositiveIntegerField()
    call_id = models.CharField(max_length=100)
    tool = models.ForeignKey("tools.Tool", null=True, on_delete=models.SET_NULL, related_name="approvals")
    tool_name = models.CharField(max_length=64)
    arguments = models.JSONField(help_text="Canonical arguments; they cannot change after the request is made.")
    arguments_hash = models.CharField(max_length=64)
    edited_arguments = models.JSONField(null=True, blank=True, editable=False,
                                        help_text="The arguments as an approver edited them (canonical); the call runs with these.")
    edited_hash = models.CharField(max_length=64, blank=True, editable=False, help_text="The hash of the edited arguments.")
    preview = models.JSONField(default=dict, blank=True, help_text="What will happen, rendered for the approver (masked).")
    required_approvals = models.PositiveSmallIntegerField(default=1)
    approver_roles = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING, db_index=True)
    requested_at = models.DateTimeField(auto_now_add=True, db_index=True)
    expires_at = models.DateTimeField(db_index=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    expiry_noticed = models.BooleanField(default=False, help_text="The channels were told it expires soon.")
    arrival_noticed = models.BooleanField(default=False, help_text="Its arrival notices were made (one per channel).")

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        db_table = "tools_approvalrequest"  # made when approvals lived in the tools app; the table kept its name
        ordering = ["-requested_at"]
        constraints = [models.UniqueConstraint(fields=["run", "call_id"], name="one_approval_per_tool_call")]
        indexes = [models.Index(fields=["tenant", "status", "requested_at"])]
        permissions = [("reveal_sensitive_fields", "Can reveal sensitive fields of approval requests")]

    def __str__(self) -> str:
        return f"{self.tool_name} for run {self.run_id} ({self.status})"

    @property
    def current_arguments(self) -> dict:
        """What would run if approved now: the edited arguments, else the call's."""
        return self.edited_arguments if self.edited_arguments is not None else self.arguments

    @property
    def current_hash(self) -> str:
        return self.edited_hash or self.arguments_hash


class ApprovalDecision(TenantOwned):
    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="decisions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    approved = models.BooleanField()
    note = models.TextField(blank=True)
    via = models.CharField(max_length=16, default="page", help_text="page, api or admin")
    arguments_hash = models.CharField(max_length=64, blank=True, help_text="The hash of the arguments this decision approved.")
    edited = models.BooleanField(default=False, help_text="This approver edited the arguments.")
    at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        db_table = "tools_approvaldecision"
        ordering = ["request", "at"]
        constraints = [models.UniqueConstraint(fields=["request", "user"], name="one_decision_per_user_and_request")]


class ChannelKind(models.TextChoices):
    EMAIL = "email", "Email to the tenant's approvers"
    WEBHOOK_SLACK = "webhook_slack", "Webhook, Slack-compatible body"
    WEBHOOK_JSON = "webhook_json", "Webhook, JSON body"


class NotifyEvent(models.TextChoices):
    ARRIVED = "arrived", "A request arrived"
    EXPIRING = "expiring", "A request expires soon"


class NotificationChannel(TenantOwned):
    """Where a tenant's approval requests are announced. Changed only through ``approvals.channels`` (audited)."""

    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    target = models.CharField(max_length=500, blank=True, help_text="The webhook URL (empty for email: the approvers are mailed).")
    secret_ref = models.CharField(max_length=80, blank=True, editable=False,
                                  help_text="secret:NAME of the signing secret (NOTIFY_SECRET_NAME); never shown.")
    events = models.JSONField(default=list, help_text='Which events: "arrived", "expiring".')
    tools = models.ManyToManyField("tools.Tool", blank=True, related_name="+",
                                   help_text="Only requests for these tools (none: every tool).")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="notification_channel_name_per_tenant")]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RETRYING = "retrying", "Retrying"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"
    SKIPPED = "skipped", "Skipped (decided meanwhile)"


class Delivery(TenantOwned):
    """One notification of one request on one channel: every attempt and the last failure, for the admin."""

    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="deliveries")
    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=16, choices=NotifyEvent.choices)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING, db_index=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    response_code = models.PositiveSmallIntegerField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "deliveries"
        constraints = [models.UniqueConstraint(fields=["channel", "request", "event"], name="one_delivery_per_channel_request_event")]

    def __str__(self) -> str:
        return f"{self.event} of {self.request_id} to {self.channel_id} ({self.status})"

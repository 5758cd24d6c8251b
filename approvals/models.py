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
    preview = models.JSONField(default=dict, blank=True, help_text="What will happen, rendered for the approver (masked).")
    required_approvals = models.PositiveSmallIntegerField(default=1)
    approver_roles = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING, db_index=True)
    requested_at = models.DateTimeField(auto_now_add=True, db_index=True)
    expires_at = models.DateTimeField(db_index=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        db_table = "tools_approvalrequest"  # made when approvals lived in the tools app; the table kept its name
        ordering = ["-requested_at"]
        constraints = [models.UniqueConstraint(fields=["run", "call_id"], name="one_approval_per_tool_call")]
        indexes = [models.Index(fields=["tenant", "status", "requested_at"])]
        permissions = [("reveal_sensitive_fields", "Can reveal sensitive fields of approval requests")]

    def __str__(self) -> str:
        return f"{self.tool_name} for run {self.run_id} ({self.status})"


class ApprovalDecision(TenantOwned):
    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="decisions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    approved = models.BooleanField()
    note = models.TextField(blank=True)
    via = models.CharField(max_length=16, default="page", help_text="page, api or admin")
    at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        db_table = "tools_approvaldecision"
        ordering = ["request", "at"]
        constraints = [models.UniqueConstraint(fields=["request", "user"], name="one_decision_per_user_and_request")]

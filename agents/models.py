"""Agents, their versions, sessions, runs, and each run's append-only trace and message log."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from tenants.scoping import TenantOwned, TenantScopedQuerySet

MODEL_NAME = RegexValidator(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.:@/-]+$", "Name the model as provider/model, e.g. demo/planner.")


class Agent(TenantOwned):
    slug = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    current_version = models.ForeignKey(
        "AgentVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The version new runs use (unless a gray release says otherwise).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "slug"]
        constraints = [models.UniqueConstraint(fields=["tenant", "slug"], name="agent_slug_unique_per_tenant")]

    def __str__(self) -> str:
        return self.slug


class AgentVersion(TenantOwned):
    """What an agent is at one point. Immutable once a run used it: make a new version instead."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    model = models.CharField(max_length=200, validators=[MODEL_NAME], help_text="provider/model, e.g. demo/planner")
    system_prompt = models.TextField(blank=True)
    tools = models.JSONField(default=list, blank=True, help_text="The names of the tools this version may call.")
    policy = models.JSONField(default=dict, blank=True, help_text="Limits, budgets, hooks and context settings.")
    note = models.CharField(max_length=300, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["agent", "-number"]
        constraints = [models.UniqueConstraint(fields=["agent", "number"], name="version_number_unique_per_agent")]

    def __str__(self) -> str:
        return f"{self.agent.slug} v{self.number}"

    @property
    def is_locked(self) -> bool:
        return self.pk is not None and Run.objects.filter(version_id=self.pk).exists()


class Session(TenantOwned):
    """A conversation: runs in the same session share history and session-wide limits."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="sessions")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    api_key = models.ForeignKey("tenants.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    facts = models.JSONField(default=dict, blank=True, help_text="Business keys the client gave (never sent to the model).")
    turns = models.PositiveIntegerField(default=0)
    model_calls = models.PositiveIntegerField(default=0)
    usage = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return str(self.id)


class Turn(TenantOwned):
    """One finished exchange of a session: what the next run's context reads."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="history")
    turn_seq = models.PositiveIntegerField()
    run = models.OneToOneField("Run", on_delete=models.CASCADE, related_name="turn")
    user_message = models.TextField()
    assistant_message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["session", "turn_seq"]
        constraints = [models.UniqueConstraint(fields=["session", "turn_seq"], name="turn_seq_unique_per_session")]


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting for approval"
    FINISHED = "finished", "Finished"


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING)


class Run(TenantOwned):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="runs")
    version = models.ForeignKey(AgentVersion, on_delete=models.PROTECT, related_name="runs")
    session = models.ForeignKey(Session, on_delete=models.PROTECT, related_name="runs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    api_key = models.ForeignKey("tenants.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED, db_index=True)
    terminal_reason = models.CharField(max_length=32, blank=True, db_index=True)
    input = models.TextField()
    output = models.TextField(blank=True)
    error = models.TextField(blank=True)
    facts = models.JSONField(default=dict, blank=True, help_text="Business keys given with this run.")

    # The checkpoint: small, rewritten each step. Messages and events are appended elsewhere.
    step = models.PositiveIntegerField(default=0)
    phase = models.CharField(max_length=16, default="planning")
    state = models.JSONField(default=dict, blank=True)
    pending_calls = models.JSONField(default=list, blank=True)
    usage = models.JSONField(default=dict, blank=True)
    last_seq = models.PositiveIntegerField(default=0)
    message_count = models.PositiveIntegerField(default=0)

    cancel_requested = models.BooleanField(default=False)
    lease_token = models.CharField(max_length=32, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    crash_count = models.PositiveSmallIntegerField(default=0)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "-created_at"]), models.Index(fields=["status", "lease_expires_at"])]

    def __str__(self) -> str:
        return f"run {self.id}"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES


class RunMessage(TenantOwned):
    """The conversation the model sees, appended a step at a time (never re-saved whole)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="messages")
    index = models.PositiveIntegerField()
    step = models.PositiveIntegerField()
    message = models.JSONField()

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["run", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="message_index_unique_per_run")]


class RunEvent(TenantOwned):
    """One entry of a run's trace. Append-only; ``seq`` is gapless per run."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    step = models.PositiveIntegerField(default=0)
    type = models.CharField(max_length=64)
    span_id = models.CharField(max_length=32)
    parent_span_id = models.CharField(max_length=32, blank=True)
    payload = models.JSONField(default=dict)
    at = models.DateTimeField()

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="event_seq_unique_per_run")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"

    def as_frame(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "step": self.step,
            "type": self.type,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id or None,
            "payload": self.payload,
            "at": self.at.isoformat(),
        }

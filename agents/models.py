"""Agents, their versions, sessions, runs, and each run's append-only trace and message log."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from agents import hooks
from runtime.config import check_policy, parse_policy
from runtime.documents import problems
from runtime.flows import FlowCatalog, FlowDefinition
from tenants.scoping import TenantOwned, TenantScopedQuerySet
from tools.models import Tool

MODEL_NAME = RegexValidator(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.:@/-]+$", "Name the model as provider/model, e.g. demo/planner.")


class AgentKind(models.TextChoices):
    AGENT = "agent", "Agent"
    FLOW = "flow", "Flow"


class Agent(TenantOwned):
    """An agent, or a flow (``kind``): a flow is an agent whose versions hold a graph (``AgentVersion.definition``),
    so runs, sessions, gray release, rollback, spend, trace and audit are the same for both."""

    slug = models.SlugField(max_length=64)
    kind = models.CharField(max_length=8, choices=AgentKind.choices, default=AgentKind.AGENT,
                            help_text="A flow's versions hold a graph of tool, agent, llm, approval and switch nodes.")
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


#: The most tools a version names (what the largest providers offer a model at once).
MAX_VERSION_TOOLS = 128

class AgentVersion(TenantOwned):
    """What an agent is at one point. Immutable once a run used it: make a new version instead."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    model = models.CharField(max_length=200, validators=[MODEL_NAME], help_text="provider/model, e.g. demo/planner")
    system_prompt = models.TextField(blank=True)
    tools = models.JSONField(default=list, blank=True, help_text="The names of the tools this version may call.")
    policy = models.JSONField(default=dict, blank=True, help_text="Limits, budgets, hooks and context settings.")
    definition = models.JSONField(
        default=dict, blank=True,
        help_text="A flow's graph (nodes, their dependencies, input mappings, switches; see runtime/flows.py); "
                  "empty for an agent. Its llm nodes use the version's model unless they name one.")
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

    def clean(self) -> None:
        """Refuse what would fail at run time (the admin and the API both come through here).

        The policy is validated by the runtime's own parser (every error names its field path, e.g.
        a hook writing ``messages``) and stored normalised, with every default filled in. Hook and
        interceptor kinds must be in the platform's extension table (built-in or installed and allowed),
        and a contributed kind's ``config`` must match its schema.
        """
        if self.is_locked:
            return  # history: nothing may change (the admin shows it read-only, the API answers 409)
        self.check_contents()

    def check_contents(self) -> None:
        """The checks of ``clean`` whether or not runs used the version (a preview of a change to one is checked as
        a new version would be); ``ValidationError`` by field."""
        from agents.extensions import registry  # the extension table reads settings: built on first use, not at import

        errors: dict[str, list[str]] = {}
        extensions = registry()
        policy_errors = check_policy(self.policy, extensions=extensions)
        if policy_errors:
            errors["policy"] = policy_errors
        else:
            self.policy = parse_policy(self.policy, extensions=extensions).document
        tool_errors = self.tool_errors()
        if tool_errors:
            errors["tools"] = tool_errors
        definition_errors = self.definition_errors()
        if definition_errors:
            errors["definition"] = definition_errors
        if "policy" not in errors:
            supervisor_errors = self.supervisor_errors()
            if supervisor_errors:
                errors["policy"] = supervisor_errors
        if self.agent_id is not None and self.tenant_id is not None and self.agent.tenant_id != self.tenant_id:
            errors["agent"] = ["The agent belongs to another tenant; pick an agent of this version's tenant."]
        if errors:
            raise ValidationError(errors)

    @property
    def is_flow(self) -> bool:
        return self.agent_id is not None and self.agent.kind == AgentKind.FLOW

    def definition_errors(self) -> list[str]:
        """A flow's version holds a valid graph over the tenant's tools and agents (stored with every default filled
        in); an agent's version holds none."""
        if not self.is_flow:
            return [] if self.definition in ({}, None) else [
                "Only a flow's versions have a definition; this version's agent is an agent (kind agent)."]
        if self.tools:
            return ["A flow names its tools in its definition's tool nodes; leave tools empty."]
        if self.tenant_id is None:
            return []  # no tenant (a form's refused choice, reported on its field): no catalog to check the graph against
        definition, found = problems(FlowDefinition, self.definition, context={"catalog": flow_catalog(self.tenant_id)})
        if definition is not None:
            self.definition = definition.to_json()
        return found

    def supervisor_errors(self) -> list[str]:
        """``policy.supervisor`` names agents of this version's tenant (a flow, another tenant's agent or the supervisor
        itself is refused) and intent concepts the router knows."""
        from agents.supervisor import sub_agent_errors  # the check reads agents and the intent table

        section = (self.policy or {}).get("supervisor") if isinstance(self.policy, dict) else None
        if not isinstance(section, dict) or self.tenant_id is None or self.agent_id is None:
            return []
        return sub_agent_errors(section, tenant_id=self.tenant_id, own_slug=self.agent.slug, is_flow=self.is_flow)

    def tool_errors(self) -> list[str]:
        """``tools`` must be a list of names of tools that exist in the version's tenant."""
        if not isinstance(self.tools, list) or not all(isinstance(n, str) and n for n in self.tools):
            shown = repr(self.tools)
            return [f"Must be a list of tool names, e.g. [\"query_order\"]; got {shown[:200]}{'…' if len(shown) > 200 else ''}."]
        if len(self.tools) > MAX_VERSION_TOOLS:
            return [f"Names {len(self.tools)} tools; a version may name at most {MAX_VERSION_TOOLS} (the most a model is "
                    "offered at once). Split the work between agents, or route with a supervisor."]
        if len(set(self.tools)) != len(self.tools):
            return ["Names a tool more than once; list each tool once."]
        if self.tenant_id is None or not self.tools:
            return []
        known = set(Tool.objects.for_tenant(self.tenant_id).filter(name__in=self.tools).values_list("name", flat=True))
        missing = [n for n in self.tools if n not in known]
        if not missing:
            return []
        available = ", ".join(sorted(Tool.objects.for_tenant(self.tenant_id).values_list("name", flat=True))[:30]) or "none"
        return [f"No tool named {n!r} in this tenant. Install it first, or use one of: {available}." for n in missing]


class Flow(Agent):
    """Flows in the admin: agents of kind ``flow``."""

    class Meta:
        proxy = True


class FlowVersion(AgentVersion):
    """Flow versions in the admin: versions of agents of kind ``flow``."""

    class Meta:
        proxy = True


def flow_catalog(tenant_id: Any) -> FlowCatalog:
    """What a tenant's flows may name: the tools its agents may resolve (own and installed) and its agents."""
    tools = {t.name: list(t.required_scopes or []) for t in hooks.resolvable_tools(tenant_id).only("name", "required_scopes")}
    agents = Agent.objects.for_tenant(tenant_id).filter(kind=AgentKind.AGENT).values_list("slug", flat=True)
    return FlowCatalog(tools=tools, agents=list(agents))


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
    # Erasure (a data-subject request): inputs, messages and outputs are gone; the audit keeps a tombstone.
    erased_at = models.DateTimeField(null=True, blank=True)
    erased_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

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
    playground = models.BooleanField(
        default=False, db_index=True,
        help_text="Started from the console's playground (an operator trying a version): counted apart in spend.")

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

    # Exactly-once acceptance: the client's Idempotency-Key (unique per tenant) and a digest of the request body.
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    request_digest = models.CharField(max_length=64, blank=True, default="")

    # Needs attention: something an operator must check by hand (a write whose outcome is unknown, ...).
    needs_attention = models.BooleanField(default=False, db_index=True)
    attention_reasons = models.JSONField(default=list, blank=True)
    attention_resolved_at = models.DateTimeField(null=True, blank=True)
    attention_resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    attention_resolution = models.TextField(blank=True)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "-created_at"]), models.Index(fields=["status", "lease_expires_at"])]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "idempotency_key"], condition=~models.Q(idempotency_key=""),
                                    name="run_idempotency_key_per_tenant"),
        ]

    def __str__(self) -> str:
        return f"run {self.id}"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES


#: The trace tables' references to their run and tenant are not checked by database constraints, and only the run
#: is indexed (by the unique (run, seq) or (run, index)). Every step appends about a dozen events and a message or
#: two: PostgreSQL checks a foreign key row by row (two lookups an event at commit, about 0.1 ms of the server's CPU a
#: step) and adds each row to every index. What the checks would catch cannot happen on the write path: a step writes
#: only through the statement that holds the run's row locked (agents/store.py), and the tenant written is the run's
#: own. Every read of these tables is by run; by tenant alone only deleting a tenant reads them (one scan, rare).
#: Deletes still cascade: Django's collector deletes a run's events and messages with it (``on_delete=CASCADE`` is
#: Django's, not the database's).
_TRACE_REFERENCE = {"on_delete": models.CASCADE, "db_constraint": False}


class RunMessage(TenantOwned):
    """The conversation the model sees, appended a step at a time (never re-saved whole)."""

    tenant = models.ForeignKey("tenants.Tenant", related_name="+", db_index=False, **_TRACE_REFERENCE)  # type: ignore[call-overload]
    # indexed by the unique (run, index) below, which starts with it
    run = models.ForeignKey(Run, related_name="messages", db_index=False, **_TRACE_REFERENCE)  # type: ignore[call-overload]
    index = models.PositiveIntegerField()
    step = models.PositiveIntegerField()
    message = models.JSONField()

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["run", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="message_index_unique_per_run")]


class RunEvent(TenantOwned):
    """One entry of a run's trace. Append-only; ``seq`` is gapless per run."""

    tenant = models.ForeignKey("tenants.Tenant", related_name="+", db_index=False, **_TRACE_REFERENCE)  # type: ignore[call-overload]
    # indexed by the unique (run, seq) below, which starts with it
    run = models.ForeignKey(Run, related_name="events", db_index=False, **_TRACE_REFERENCE)  # type: ignore[call-overload]
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


class ProviderKind(models.TextChoices):
    OPENAI_COMPATIBLE = "openai_compatible", "OpenAI-compatible API"
    DETERMINISTIC = "deterministic", "Deterministic planner (no network)"


class ProviderQuerySet(TenantScopedQuerySet):
    """``for_actor`` as everywhere: a shared provider (no tenant) is seen and managed by superusers only."""

    def visible_to_tenant(self, tenant_id: int) -> ProviderQuerySet:
        """What a run of this tenant may use: its own providers and the shared ones."""
        return self.filter(models.Q(tenant_id=tenant_id) | models.Q(tenant__isnull=True))


class Provider(models.Model):
    """A model provider: the ``provider`` part of ``provider/model``. See ``agents/providers.py``.

    The API key is stored encrypted (``api_key_encrypted``) or as the name of an environment variable
    (``api_key_env``); default headers are stored encrypted too. Neither is ever shown back.
    """

    tenant = models.ForeignKey(
        "tenants.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="+",
        help_text="Empty: a shared provider, available to every tenant (managed by superusers only).",
    )
    name = models.CharField(
        max_length=64, validators=[RegexValidator(r"^[A-Za-z0-9_.-]+$", "Use letters, digits, '.', '_' or '-' (no '/').")],
        help_text="The provider part of 'provider/model', e.g. openai.",
    )
    kind = models.CharField(max_length=32, choices=ProviderKind.choices, default=ProviderKind.OPENAI_COMPATIBLE)
    base_url = models.CharField(max_length=500, blank=True, help_text="e.g. https://api.openai.com/v1")
    api_key_encrypted = models.TextField(blank=True, editable=False)
    api_key_env = models.CharField(max_length=128, blank=True, editable=False)
    default_headers_encrypted = models.TextField(blank=True, editable=False)
    default_header_names = models.JSONField(default=list, blank=True, editable=False)
    timeout = models.FloatField(default=30.0, help_text="Seconds to wait for one answer.")
    max_retries = models.PositiveSmallIntegerField(default=1, help_text="Retries on the same provider before failing over.")
    offered_models = models.JSONField(
        default=dict, blank=True, verbose_name="models",
        help_text='The models offered, e.g. {"gpt-4o-mini": {"context_window": 128000, "price_in_per_1m": 0.15, "price_out_per_1m": 0.6}}',
    )
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: unlimited.")
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: unlimited.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ProviderQuerySet.as_manager()

    class Meta:
        ordering = ["tenant_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="provider_name_unique_per_tenant"),
            models.UniqueConstraint(fields=["name"], condition=models.Q(tenant__isnull=True), name="provider_name_unique_shared"),
        ]

    def __str__(self) -> str:
        return self.name if self.tenant_id is None else f"{self.name} ({self.tenant_id})"

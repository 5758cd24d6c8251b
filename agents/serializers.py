from __future__ import annotations

import datetime as dt
import json
import re
import zoneinfo
from typing import Any

from django.conf import settings
from django.utils import timezone
from django.utils.functional import cached_property
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from agents.models import Agent, AgentKind, AgentVersion, Run, RunEvent
from config.documents import document_field
from runtime.flows import FlowDefinition
from runtime.policy_document import Policy
from runtime.state import LLM_CALL_COUNT, LOOP_DETECTION, MESSAGES, SESSION_MODEL_CALLS, SESSION_USAGE

#: A fact's key: a letter, then letters, digits, ``_ . : -``; 64 characters at most (keys starting with ``_`` are the loop's).
FACT_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]{0,63}$")
FACTS_MAX_KEYS = 50
FACTS_MAX_BYTES = 16_384
#: State keys the agent loop owns: a fact may not set them (the run would fail, or start with forged counters).
LOOP_KEYS = frozenset({MESSAGES, LLM_CALL_COUNT, SESSION_MODEL_CALLS, SESSION_USAGE, LOOP_DETECTION})


def fact_problems(facts: dict[str, Any]) -> list[str]:
    """Why ``facts`` cannot start a run, checked at the request so a run never fails on them later."""
    if len(facts) > FACTS_MAX_KEYS:
        return [f"At most {FACTS_MAX_KEYS} keys; got {len(facts)}."]
    problems = [f"Keys must match {FACT_KEY.pattern} (a letter first); got {key!r}." for key in facts if not FACT_KEY.match(key)]
    problems += [f"{key!r} belongs to the agent loop; use another name." for key in facts if key in LOOP_KEYS]
    size = len(json.dumps(facts, ensure_ascii=False).encode())
    if size > FACTS_MAX_BYTES:
        problems.append(f"At most {FACTS_MAX_BYTES} bytes as JSON; got {size}.")
    return problems


class RunCreateSerializer(serializers.Serializer):
    agent = serializers.SlugField(help_text="The agent's slug, e.g. order-assistant.")
    input = serializers.CharField(trim_whitespace=True, help_text="The user's message.")
    session = serializers.UUIDField(required=False, allow_null=True, help_text="Continue this session; omit to start one.")
    facts = serializers.DictField(
        required=False,
        help_text=(f"Business keys for the run (never shown to the model): at most {FACTS_MAX_KEYS} keys matching "
                   f"{FACT_KEY.pattern}, {FACTS_MAX_BYTES} bytes as JSON; not {', '.join(sorted(LOOP_KEYS))}."),
    )
    stream = serializers.BooleanField(
        required=False, default=False,
        help_text="Answer with the run's event stream (as GET /runs/<id>/stream) instead of JSON; so does Accept: text/event-stream.",
    )

    def validate_input(self, value: str) -> str:
        limit = settings.RUN_INPUT_MAX_CHARS
        if len(value) > limit:
            raise serializers.ValidationError(f"Must be at most {limit} characters; got {len(value)}.")
        return value

    def validate_facts(self, value: dict[str, Any]) -> dict[str, Any]:
        problems = fact_problems(value)
        if problems:
            raise serializers.ValidationError(problems)
        return value


class FlowRunCreateSerializer(serializers.Serializer):
    flow = serializers.SlugField(help_text="The flow's slug, e.g. refund-desk.")
    input = serializers.JSONField(help_text="The flow's input: a JSON object its mappings read as input.<key>.")
    facts = serializers.DictField(required=False, help_text="Business keys for the run, as for an agent's run.")

    def validate_input(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise serializers.ValidationError(f"Must be a JSON object (its keys are read as input.<key>); got {type(value).__name__}.")
        size = len(json.dumps(value, default=str))
        if size > settings.RUN_INPUT_MAX_CHARS:
            raise serializers.ValidationError(f"Must be at most {settings.RUN_INPUT_MAX_CHARS} characters as JSON; got {size}.")
        return value

    def validate_facts(self, value: dict[str, Any]) -> dict[str, Any]:
        problems = fact_problems(value)
        if problems:
            raise serializers.ValidationError(problems)
        return value


class OnePageZone:
    """``_zone``: the time zone a page's dates are written in, looked up once per page, not once per date (a
    serializer lives for one request; with ``many=True`` its one child writes every row)."""

    @cached_property
    def _zone(self) -> Any:
        return timezone.get_current_timezone()


class RunSerializer(OnePageZone, serializers.ModelSerializer):
    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    version = serializers.IntegerField(source="version.number", read_only=True)
    session = serializers.UUIDField(source="session_id", read_only=True)
    links = serializers.SerializerMethodField()
    injection_flags = serializers.SerializerMethodField(help_text="Prompt-injection patterns found in the input (flag mode).")
    needs_attention = serializers.BooleanField(
        read_only=True,
        help_text="An operator must check something this run did (e.g. a write whose outcome is unknown); "
                  "POST resolve-attention once checked.",
    )
    attention_reasons = serializers.ListField(
        child=serializers.DictField(), read_only=True,
        help_text='Why it was marked, oldest first, kept after resolution: e.g. {"kind": "outcome_unknown", "tool": ..., '
                  '"call_id": ..., "step": ..., "audit_id": ..., "at": ...}. Kinds: outcome_unknown, write_timeout, '
                  "unfinished_write, crash_loop.",
    )
    attention_resolved_at = serializers.DateTimeField(read_only=True, allow_null=True)
    attention_resolved_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    attention_resolution = serializers.CharField(read_only=True, help_text="What the operator who resolved it checked.")
    playground = serializers.BooleanField(
        read_only=True, help_text="Started from the console's playground (an operator trying a version); counted apart "
                                  "in spend. Filter with ?playground=true|false.")
    parent_run = serializers.SerializerMethodField(
        help_text="The run that started this one as a child (an agent-kind tool or a supervisor routing to this agent); "
                  "null for a top-level run.")

    class Meta:
        model = Run
        fields = [
            "id", "status", "terminal_reason", "agent", "version", "session", "input", "output", "error",
            "usage", "step", "last_seq", "cancel_requested", "created_at", "started_at", "finished_at",
            "injection_flags", "needs_attention", "attention_reasons", "attention_resolved_at", "attention_resolved_by",
            "attention_resolution", "parent_run", "playground", "links",
        ]
        read_only_fields = fields

    def get_parent_run(self, run: Run) -> str | None:
        parent = (run.facts or {}).get("parent_run")
        return str(parent) if parent else None

    def get_injection_flags(self, run: Run) -> list[Any]:
        return list((run.facts or {}).get("injection_flags", []))

    def to_representation(self, run: Run | dict[str, Any]) -> dict[str, Any]:
        """The fields above, written out: the same body as DRF's field-by-field walk (``generic_representation``;
        tests/db/test_api_lean.py compares them), at a fraction of its cost on a page of runs (issue #14). A page of
        the runs list comes as row dicts (config/compiled.py ``CompiledRead.dicts``: no model instances made)."""
        if isinstance(run, dict):
            return self.row_representation(run)
        resolved_by = run.attention_resolved_by
        zone = self._zone
        pk = str(run.pk)  # once: UUID.__str__ is Python, and the links repeat it
        return {
            "id": pk, "status": run.status, "terminal_reason": run.terminal_reason, "agent": run.agent.slug,
            "version": run.version.number, "session": str(run.session_id), "input": run.input, "output": run.output,
            "error": run.error, "usage": run.usage, "step": run.step, "last_seq": run.last_seq,
            "cancel_requested": run.cancel_requested, "created_at": iso_datetime(run.created_at, zone),
            "started_at": iso_datetime(run.started_at, zone), "finished_at": iso_datetime(run.finished_at, zone),
            "injection_flags": self.get_injection_flags(run), "needs_attention": run.needs_attention,
            "attention_reasons": [None if reason is None else {str(k): v for k, v in reason.items()}
                                  for reason in run.attention_reasons],
            "attention_resolved_at": iso_datetime(run.attention_resolved_at, zone),
            "attention_resolved_by": resolved_by.username if resolved_by is not None else None,
            "attention_resolution": run.attention_resolution, "parent_run": self.get_parent_run(run),
            "playground": run.playground, "links": self._links(pk),
        }

    def row_representation(self, row: dict[str, Any]) -> dict[str, Any]:
        """:meth:`to_representation` of a run read as a row dict (``RUN_READ_FIELDS`` by column name)."""
        zone = self._zone
        pk = str(row["id"])
        facts = row["facts"] or {}
        parent = facts.get("parent_run")
        return {
            "id": pk, "status": row["status"], "terminal_reason": row["terminal_reason"], "agent": row["agent__slug"],
            "version": row["version__number"], "session": str(row["session_id"]), "input": row["input"],
            "output": row["output"], "error": row["error"], "usage": row["usage"], "step": row["step"],
            "last_seq": row["last_seq"], "cancel_requested": row["cancel_requested"],
            "created_at": iso_datetime(row["created_at"], zone), "started_at": iso_datetime(row["started_at"], zone),
            "finished_at": iso_datetime(row["finished_at"], zone),
            "injection_flags": list(facts.get("injection_flags", [])), "needs_attention": row["needs_attention"],
            "attention_reasons": [None if reason is None else {str(k): v for k, v in reason.items()}
                                  for reason in row["attention_reasons"]],
            "attention_resolved_at": iso_datetime(row["attention_resolved_at"], zone),
            "attention_resolved_by": row["attention_resolved_by__username"],
            "attention_resolution": row["attention_resolution"], "parent_run": str(parent) if parent else None,
            "playground": row["playground"], "links": self._links(pk),
        }

    def generic_representation(self, run: Run) -> dict[str, Any]:
        return dict(super().to_representation(run))

    @cached_property
    def _bases(self) -> tuple[str, str]:
        request = self.context.get("request")
        base = request.build_absolute_uri("/") if request is not None else "/"
        return base, base.replace("https://", "wss://").replace("http://", "ws://")

    def get_links(self, run: Run) -> dict[str, str]:
        return self._links(str(run.pk))

    def _links(self, pk: str) -> dict[str, str]:
        base, ws_base = self._bases  # once per page, not once per run
        return {"self": f"{base}api/v1/runs/{pk}", "events": f"{base}api/v1/runs/{pk}/events", "ws": f"{ws_base}ws/runs/{pk}/"}


class ResolveAttentionSerializer(serializers.Serializer):
    note = serializers.CharField(
        max_length=2000, trim_whitespace=True,
        help_text="What you checked and found (e.g. the refund was made once at the payment provider). Kept on the run "
                  "and in the audit; personal data in it is masked.",
    )


class RunEventSerializer(OnePageZone, serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["seq", "step", "type", "span_id", "parent_span_id", "payload", "at"]
        read_only_fields = fields

    def to_representation(self, event: RunEvent | dict[str, Any]) -> dict[str, Any]:
        """Written out, as :meth:`RunSerializer.to_representation` (same body as DRF's walk, a fraction of its cost);
        an event read as a row dict (``CompiledRead.dicts``) the same way."""
        if isinstance(event, dict):
            return {"seq": event["seq"], "step": event["step"], "type": event["type"], "span_id": event["span_id"],
                    "parent_span_id": event["parent_span_id"], "payload": event["payload"],
                    "at": iso_datetime(event["at"], self._zone)}
        return {"seq": event.seq, "step": event.step, "type": event.type, "span_id": event.span_id,
                "parent_span_id": event.parent_span_id, "payload": event.payload, "at": iso_datetime(event.at, self._zone)}

    def generic_representation(self, event: RunEvent) -> dict[str, Any]:
        return dict(super().to_representation(event))


#: What the run list, a run and its events page read of a run: what RunSerializer shows, and the tenant (for the
#: permission check). Never the run's state (its whole conversation), pending calls or lease.
RUN_READ_FIELDS = (
    "id", "tenant", "status", "terminal_reason", "agent__slug", "version__number", "session", "input", "output",
    "error", "usage", "step", "last_seq", "cancel_requested", "created_at", "started_at", "finished_at", "facts",
    "needs_attention", "attention_reasons", "attention_resolved_at", "attention_resolved_by__username",
    "attention_resolution", "playground",
)


_UTC_ZONE = zoneinfo.ZoneInfo("UTC")  # the same object Django's get_current_timezone() gives (ZoneInfo caches by key)


def iso_datetime(value: Any, zone: Any = None) -> str | None:
    """DRF's rendering of a DateTimeField (ISO 8601 in the current time zone — or ``zone``, when the caller looked
    it up once for many values — UTC as ``Z``)."""
    if not value:
        return None
    zone = zone or timezone.get_current_timezone()
    tz = value.tzinfo
    if tz is dt.UTC and zone is _UTC_ZONE:  # the common case, first: read from the database, written in UTC
        return value.isoformat()[:-6] + "Z"
    # a value read from the database is in UTC (datetime.UTC), as the zone usually is (ZoneInfo("UTC")): as it is
    if tz is not zone and not (tz is dt.UTC and getattr(zone, "key", None) == "UTC") and timezone.is_aware(value):
        value = value.astimezone(zone)
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class AgentSerializer(serializers.ModelSerializer):
    current_version = serializers.SerializerMethodField()

    class Meta:
        model = Agent
        fields = ["slug", "kind", "name", "description", "current_version", "created_at", "updated_at"]
        read_only_fields = fields

    @extend_schema_field(inline_serializer("CurrentVersion", {
        "number": serializers.IntegerField(),
        "model": serializers.CharField(),
        "tools": serializers.ListField(child=serializers.CharField(),
                                       help_text="The version's tools; for a flow, the tools its tool nodes call."),
        "input_schema": serializers.DictField(required=False, allow_null=True,
                                              help_text="A flow's only: the JSON Schema its input must match, or null."),
    }, allow_null=True))
    def get_current_version(self, agent: Agent) -> dict[str, Any] | None:
        version: AgentVersion | None = agent.current_version
        if version is None:
            return None
        if agent.kind != AgentKind.FLOW:
            return {"number": version.number, "model": version.model, "tools": version.tools}
        definition = version.definition or {}
        nodes = [*definition.get("nodes", []),
                 *(child for node in definition.get("nodes", []) for child in ((node.get("body") or {}).get("nodes") or []))]
        tools = sorted({str(n["tool"]) for n in nodes if n.get("kind") == "tool" and n.get("tool")})
        return {"number": version.number, "model": version.model, "tools": tools,
                "input_schema": definition.get("input_schema")}


class AgentCreateSerializer(serializers.Serializer):
    slug = serializers.SlugField(max_length=64, help_text="Unique in the tenant, e.g. order-assistant.")
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")


class AgentVersionSerializer(serializers.ModelSerializer):
    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    locked = serializers.SerializerMethodField(help_text="True once a run used it: it can no longer change.")
    current = serializers.SerializerMethodField(help_text="True if new runs of the agent use this version.")
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    policy = document_field(Policy, read_only=True, help_text="The runtime policy, every default filled in.")
    definition = document_field(FlowDefinition, read_only=True, empty_as_null=True,
                                help_text="A flow version's graph, every default filled in; null for an agent's version.")

    class Meta:
        model = AgentVersion
        fields = ["agent", "number", "model", "system_prompt", "tools", "policy", "definition", "note", "locked", "current",
                  "created_by", "created_at"]
        read_only_fields = fields

    def get_locked(self, version: AgentVersion) -> bool:
        used = getattr(version, "used", None)
        return bool(used) if used is not None else version.is_locked

    def get_current(self, version: AgentVersion) -> bool:
        return version.agent.current_version_id == version.pk


class AgentVersionWriteSerializer(serializers.Serializer):
    """Shapes only; ``AgentVersion.clean()`` checks the model name, the tools and the policy."""

    model = serializers.CharField(max_length=200, help_text="provider/model, e.g. demo/planner.")
    system_prompt = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    tools = serializers.JSONField(required=False, help_text='Names of tools of this tenant, e.g. ["query_order"].')
    policy = document_field(
        Policy,
        required=False,
        help_text="The runtime policy (limits, budgets, hooks, context, approvals); stored normalised. approvals.tools.<tool> may "
                  "make a tool's own approval policy stricter, never looser; only the tenant's owner, signed in, may loosen "
                  'it, with "override_floor": true (audited).',
    )
    definition = document_field(
        FlowDefinition, required=False,
        help_text="A flow version's graph: nodes (tool, agent, llm, approval, switch), their after-dependencies, JMESPath "
                  "input mappings over {input, nodes}; checked at save against the tenant's tools, agents and the flow's "
                  "scopes. Only for flows (/flows/<slug>/versions).")
    note = serializers.CharField(required=False, allow_blank=True, max_length=300)
    make_current = serializers.BooleanField(
        required=False, default=False,
        help_text="New runs of the agent use this version. With a release gate, only a version whose replay passed the gate "
                  "(or one that was the stable version before: a rollback) may: else 409 release_gate, audited.")


class VersionPreviewSerializer(serializers.Serializer):
    """A proposed, unsaved tool list and/or policy document for a version; fields left out keep their value."""

    days = serializers.IntegerField(required=False, min_value=1, max_value=30)
    tools = serializers.ListField(child=serializers.CharField(max_length=64), required=False)
    policy = serializers.JSONField(required=False)

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.utils.functional import cached_property
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from agents.models import Agent, AgentKind, AgentVersion, Run, RunEvent
from core.documents import document_field
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


class RunSerializer(serializers.ModelSerializer):
    """A run's JSON body, the one declaration of it: the API's list, detail, create, cancel and resolve answers."""

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

    @cached_property
    def _bases(self) -> tuple[str, str]:
        request = self.context.get("request")
        base = request.build_absolute_uri("/") if request is not None else "/"
        return base, base.replace("https://", "wss://").replace("http://", "ws://")

    def get_links(self, run: Run) -> dict[str, str]:
        base, ws_base = self._bases  # once per page, not once per run
        pk = str(run.pk)
        return {"self": f"{base}api/v1/runs/{pk}", "events": f"{base}api/v1/runs/{pk}/events", "ws": f"{ws_base}ws/runs/{pk}/"}


class ResolveAttentionSerializer(serializers.Serializer):
    note = serializers.CharField(
        max_length=2000, trim_whitespace=True,
        help_text="What you checked and found (e.g. the refund was made once at the payment provider). Kept on the run "
                  "and in the audit; personal data in it is masked.",
    )


class RunEventSerializer(serializers.ModelSerializer):
    """A trace event's JSON body, the one declaration of it: the events page, the stream, the websocket, the console."""

    class Meta:
        model = RunEvent
        fields = ["seq", "step", "type", "span_id", "parent_span_id", "payload", "at"]
        read_only_fields = fields


def event_frames(rows: Iterable[RunEvent]) -> list[dict[str, Any]]:
    """Events as the stream, the websocket and the console send them: :class:`RunEventSerializer`'s body."""
    return [dict(body) for body in RunEventSerializer(rows, many=True).data]


#: What the run list, a run and its events page read of a run: what RunSerializer shows, and the tenant (for the
#: permission check). Never the run's state (its whole conversation), pending calls or lease.
RUN_READ_FIELDS = (
    "id", "tenant", "status", "terminal_reason", "agent__slug", "version__number", "session", "input", "output",
    "error", "usage", "step", "last_seq", "cancel_requested", "created_at", "started_at", "finished_at", "facts",
    "needs_attention", "attention_reasons", "attention_resolved_at", "attention_resolved_by__username",
    "attention_resolution", "playground",
)


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

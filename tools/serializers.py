"""Tool API shapes, and the checks a tool's definition must pass before it is saved.

Errors name the field, and inside ``config`` the key (``{"config": {"url": ["..."]}}``), so an
operator sees at once what to fix.
"""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from runtime import schemas
from runtime.documents import openapi_schema
from tools import kinds, rate_limits
from tools.isolation import isolation_problems
from tools.kinds.base import secret_problems, string_list
from tools.models import Tool, ToolKind

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TIMEOUT_SECONDS = 600.0
WRITABLE_FIELDS = (
    "name", "description", "kind", "parameters", "output_schema", "config", "category", "idempotent", "required_scopes",
    "requires_approval", "enabled", "timeout_seconds", "result_fields", "summary_template", "result_size_cap", "sensitive_fields",
    "rate_limit_per_minute",
)


# --------------------------------------------------------------------------- checks


def schema_problems(schema: Any, *, root_object: bool = True) -> list[str]:
    """Why ``schema`` is not a usable JSON Schema (Draft 2020-12), each with where it is wrong."""
    if not isinstance(schema, dict):
        return ['must be a JSON Schema object, e.g. {"type": "object", "properties": {}}']
    if not schema:
        return []
    if (wrong := schemas.invalid(schema)) is not None:
        return [_at(*wrong)]
    if root_object and schema.get("type") != "object":
        return ['the arguments are an object: the schema needs "type": "object" at the top']
    return [_at(where, problem) for where, problem in schemas.unsafe_parts(schema)]


def _at(where: list[str | int], problem: str) -> str:
    return problem + (f" (at {'/'.join(map(str, where))})" if where else "")


def _allow_hosts(config: Any) -> list[Any]:
    if not isinstance(config, dict):
        return []
    server = config.get("server")
    return [config.get("allow_hosts") or [], (server.get("allow_hosts") or []) if isinstance(server, dict) else []]


def config_problems(kind: str, config: Any, parameters: dict[str, Any], *, tenant: Any,
                    current: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """Kind-specific problems in ``config``, keyed by the config key they concern.

    ``allow_hosts`` (reaching private addresses past the egress guard) stays as a platform
    administrator set it: the API neither adds nor changes it (``current`` is the stored config).
    """
    if not isinstance(config, dict):
        return {"config": ["must be an object"]}
    problems: dict[str, list[str]] = {}

    def add(key: str, message: str) -> None:
        problems.setdefault(key, []).append(message)

    if _allow_hosts(config) != _allow_hosts(current or {}):
        add("allow_hosts", "only a platform administrator may let a tool reach private addresses (Django admin); "
                           "leave allow_hosts as it is")
    spec = kinds.kind_for(kind)
    if spec is not None:
        spec.check(config, parameters or {}, tenant, add)
    isolation = isolation_problems(kind, config)
    if isolation:  # said once, in the isolation module's words (a kind without it calls it an unknown field)
        problems["isolation"] = isolation
    return problems


# --------------------------------------------------------------------------- tools


@extend_schema_field({
    "oneOf": [{**openapi_schema(kind.config_model), "title": f"{name} config"} for name, kind in kinds.KINDS.items()],
    "description": "The kind's settings: one of the documents below, by kind (python, http, mcp, agent).",
})
class ConfigField(serializers.JSONField):
    """A tool's ``config``: its OpenAPI schema is each kind's typed document (``tools.kinds.config_schemas``)."""


class ToolSerializer(serializers.ModelSerializer):
    config = ConfigField(required=False, help_text="The kind's settings (see the schema of each kind).")
    plugin = serializers.SerializerMethodField(help_text="The plugin that provided the tool; null for the tenant's own.")
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Tool
        fields = ["id", "tenant", *WRITABLE_FIELDS, "plugin", "created_at", "updated_at"]
        read_only_fields = ["id", "tenant", "plugin", "created_at", "updated_at"]
        extra_kwargs = {"parameters": {"required": False},
                        "timeout_seconds": {"required": False},
                        "rate_limit_per_minute": {
                            "required": False, "min_value": 1, "max_value": rate_limits.MAX_PER_MINUTE,
                            "error_messages": {"min_value": rate_limits.RANGE_MESSAGE, "max_value": rate_limits.RANGE_MESSAGE},
                            "help_text": f"Calls per minute per tenant for this tool (1 to {rate_limits.MAX_PER_MINUTE}); null "
                                         "means no limit. On a plugin's tool you may lower the plugin's limit, not raise it."}}
        # Uniqueness per tenant is the service's check (with a message naming the tenant).
        validators: list[Any] = []

    def get_plugin(self, tool: Tool) -> str | None:
        install = tool.plugin_install
        if install is None:
            return None
        return install.plugin_key

    def validate_name(self, value: str) -> str:
        if not NAME_RE.match(value):
            raise serializers.ValidationError("Use 1 to 64 letters, digits, _ or - (the model calls the tool by this name).")
        return value

    def validate_parameters(self, value: Any) -> Any:
        problems = schema_problems(value)
        if problems:
            raise serializers.ValidationError(problems)
        return value

    def validate_output_schema(self, value: Any) -> Any:
        problems = schema_problems(value, root_object=False)
        if problems:
            raise serializers.ValidationError(problems)
        return value

    def validate_timeout_seconds(self, value: float) -> float:
        if not 0 < value <= MAX_TIMEOUT_SECONDS:
            raise serializers.ValidationError(f"Must be more than 0 and at most {MAX_TIMEOUT_SECONDS:g} seconds.")
        return value

    def validate_rate_limit_per_minute(self, value: int | None) -> int | None:
        problem = rate_limits.value_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_result_size_cap(self, value: int) -> int:
        if value < 100:
            raise serializers.ValidationError("Must be at least 100 characters.")
        return value

    def _list_of_strings(self, value: Any) -> Any:
        if not string_list(value):
            raise serializers.ValidationError("Must be a list of strings.")
        return value

    validate_required_scopes = _list_of_strings
    validate_result_fields = _list_of_strings
    validate_sensitive_fields = _list_of_strings

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        instance: Tool | None = self.instance
        merged = {f: attrs[f] if f in attrs else getattr(instance, f, None) for f in ("kind", "config", "parameters")}
        kind = merged["kind"] or ToolKind.PYTHON
        if instance is None:
            spec = kinds.kind_for(kind)
            if spec is not None and spec.default_parameters is not None and not attrs.get("parameters"):
                attrs["parameters"] = merged["parameters"] = dict(spec.default_parameters)
            attrs.setdefault("timeout_seconds", spec.default_timeout if spec is not None else 10.0)
        if {"kind", "config", "parameters"} & set(attrs) or instance is None:
            tenant = instance.tenant if instance is not None else self.context.get("tenant")
            problems = config_problems(kind, merged["config"] or {}, merged["parameters"] or {}, tenant=tenant,
                                       current=instance.config if instance is not None else None)
            if problems:
                raise serializers.ValidationError({"config": problems})
        return attrs


class DryRunSerializer(serializers.Serializer):
    arguments = serializers.JSONField(help_text='The arguments as the model would send them: an object or a JSON string.')

    def validate_arguments(self, value: Any) -> Any:
        if not isinstance(value, dict | str):
            raise serializers.ValidationError("Send an object, or the raw string the model produced.")
        return value


class McpImportSerializer(serializers.Serializer):
    server = serializers.JSONField(help_text='{"command": ["python", "-m", "mcp_server_time"]} or {"url": "https://.../mcp"}')
    prefix = serializers.CharField(required=False, allow_blank=True, default="", max_length=32,
                                   help_text="Put before each imported name, e.g. time_ (to avoid clashes).")
    tools = serializers.ListField(child=serializers.CharField(), required=False, help_text="Import only these (server names).")

    def validate_server(self, value: Any) -> Any:
        from tools.mcp_import import server_problems

        problems = server_problems(value)
        if not problems:
            tenant = self.context.get("tenant")
            problems = secret_problems(value.get("headers"), tenant) + secret_problems(value.get("env"), tenant)
            if value.get("allow_hosts"):
                problems.append("only a platform administrator may let a server be reached at a private address (allow_hosts)")
        if problems:
            raise serializers.ValidationError(problems)
        return value

class PreviewImpactSerializer(serializers.Serializer):
    """A proposed, unsaved policy for a tool; fields left out keep their current value."""

    days = serializers.IntegerField(required=False, min_value=1, max_value=30,
                                    help_text="The days of recorded calls to replay (1 to 30, default 7).")
    enabled = serializers.BooleanField(required=False)
    required_scopes = serializers.ListField(child=serializers.CharField(max_length=200), required=False)
    requires_approval = serializers.BooleanField(required=False)
    approval_policy = serializers.JSONField(required=False)
    rate_limit_per_minute = serializers.IntegerField(required=False, allow_null=True, min_value=1,
                                                     max_value=rate_limits.MAX_PER_MINUTE)

    def validate_approval_policy(self, value: Any) -> Any:
        if not isinstance(value, dict):
            raise serializers.ValidationError("Send an object (empty follows requires_approval).")
        return value


class ImpactExampleSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    run = serializers.CharField()
    agent = serializers.CharField(allow_null=True)
    step = serializers.IntegerField()
    recorded_status = serializers.CharField()
    before = serializers.CharField()
    after = serializers.CharField()
    reason = serializers.CharField()
    arguments = serializers.CharField(help_text="Masked, as in the audit row.")


class ImpactSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    by_tenant = serializers.DictField(child=serializers.IntegerField())
    by_agent = serializers.DictField(child=serializers.IntegerField())
    by_tool = serializers.DictField(child=serializers.IntegerField())
    examples = ImpactExampleSerializer(many=True)


class PreviewImpactResultSerializer(serializers.Serializer):
    tool = serializers.CharField()
    tenant = serializers.CharField()
    days = serializers.IntegerField()
    since = serializers.DateTimeField()
    changed = serializers.ListField(child=serializers.CharField())
    calls_evaluated = serializers.IntegerField()
    calls_not_evaluated = serializers.IntegerField()
    truncated = serializers.BooleanField()
    truncated_at = serializers.IntegerField(allow_null=True)
    note = serializers.CharField()
    newly_denied = ImpactSerializer()
    newly_needs_approval = ImpactSerializer()
    newly_rate_limited = ImpactSerializer()
    newly_allowed = ImpactSerializer()

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from agents.models import Agent, AgentVersion, Run, RunEvent


class RunCreateSerializer(serializers.Serializer):
    agent = serializers.SlugField(help_text="The agent's slug, e.g. order-assistant.")
    input = serializers.CharField(trim_whitespace=True, help_text="The user's message.")
    session = serializers.UUIDField(required=False, allow_null=True, help_text="Continue this session; omit to start one.")
    facts = serializers.DictField(required=False, help_text="Business keys for the run (never shown to the model).")

    def validate_input(self, value: str) -> str:
        limit = settings.RUN_INPUT_MAX_CHARS
        if len(value) > limit:
            raise serializers.ValidationError(f"Must be at most {limit} characters; got {len(value)}.")
        return value


class RunSerializer(serializers.ModelSerializer):
    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    version = serializers.IntegerField(source="version.number", read_only=True)
    session = serializers.UUIDField(source="session_id", read_only=True)
    links = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id", "status", "terminal_reason", "agent", "version", "session", "input", "output", "error",
            "usage", "step", "last_seq", "cancel_requested", "created_at", "started_at", "finished_at", "links",
        ]
        read_only_fields = fields

    def get_links(self, run: Run) -> dict[str, str]:
        request = self.context.get("request")
        base = request.build_absolute_uri("/") if request is not None else "/"
        ws_base = base.replace("https://", "wss://").replace("http://", "ws://")
        return {
            "self": f"{base}api/v1/runs/{run.pk}",
            "events": f"{base}api/v1/runs/{run.pk}/events",
            "ws": f"{ws_base}ws/runs/{run.pk}/",
        }


class RunEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["seq", "step", "type", "span_id", "parent_span_id", "payload", "at"]
        read_only_fields = fields


class AgentSerializer(serializers.ModelSerializer):
    current_version = serializers.SerializerMethodField()

    class Meta:
        model = Agent
        fields = ["slug", "name", "description", "current_version", "created_at", "updated_at"]
        read_only_fields = fields

    def get_current_version(self, agent: Agent) -> dict[str, Any] | None:
        version: AgentVersion | None = agent.current_version
        if version is None:
            return None
        return {"number": version.number, "model": version.model, "tools": version.tools}

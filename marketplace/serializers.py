from __future__ import annotations

from typing import Any

from rest_framework import serializers

from agents.models import Agent
from core.documents import document_field
from marketplace.gate import describe as describe_gate
from marketplace.gate_checks import ReplayCheck
from marketplace.models import Plugin, PluginInstall, ReleaseGuard, ReleaseWeight
from marketplace.release import observed_split
from releases.models import ModelMode


class PluginSerializer(serializers.ModelSerializer):
    class Meta:
        model = Plugin
        fields = ["key", "version", "name", "description", "source", "tools", "presets", "scopes", "hosts", "config_schema",
                  "requires_install", "synced_at"]
        read_only_fields = fields


class InstallSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    plugin = serializers.CharField(source="plugin_key", read_only=True)
    version = serializers.CharField(read_only=True)
    pending_version = serializers.SerializerMethodField()
    tools = serializers.SerializerMethodField()

    class Meta:
        model = PluginInstall
        fields = ["id", "tenant", "plugin", "version", "pending_version", "status", "config", "granted_scopes", "granted_hosts",
                  "tools", "installed_at", "consented_at", "updated_at"]
        read_only_fields = fields

    def get_pending_version(self, install: PluginInstall) -> str | None:
        return install.pending_plugin.version if install.pending_plugin is not None else None

    def get_tools(self, install: PluginInstall) -> list[str]:
        return sorted(install.tools.values_list("name", flat=True))


class InstallCreateSerializer(serializers.Serializer):
    plugin = serializers.SlugField(help_text="The plugin's key, e.g. order-desk.")
    config = serializers.DictField(required=False, help_text="The tenant's configuration (the plugin's config_schema).")


class InstallConfigSerializer(serializers.Serializer):
    config = serializers.DictField(help_text="The whole new configuration, as a JSON object (the plugin's config_schema).")


class InstallUpgradeSerializer(serializers.Serializer):
    config = serializers.DictField(required=False, allow_null=True,
                                   help_text="A new configuration for the new version; omit it to keep the current one.")


class ReleaseSerializer(serializers.ModelSerializer):
    agent = serializers.SlugField(source="slug", read_only=True)
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    stable_version = serializers.IntegerField(source="current_version.number", read_only=True, default=None, allow_null=True)
    weights = serializers.SerializerMethodField()
    guards = serializers.SerializerMethodField()
    gate = serializers.SerializerMethodField(help_text="The release gate (null: none): a version other than the stable one "
                                                       "gets weight only after a passed replay on this evaluation set.")

    class Meta:
        model = Agent
        fields = ["agent", "tenant", "stable_version", "weights", "guards", "gate"]
        read_only_fields = fields

    def get_weights(self, agent: Agent) -> list[dict[str, Any]]:
        observed = observed_split(agent)
        rows = ReleaseWeight.objects.filter(agent=agent).select_related("version").order_by("version__number")
        return [
            {"version": r.version.number, "weight": r.weight, "live_since": r.live_since,
             "observed_percent": round(observed.get(r.version.number, (0, 0.0))[1], 1)}
            for r in rows
        ]

    def get_gate(self, agent: Agent) -> dict[str, Any] | None:
        return describe_gate(agent)

    def get_guards(self, agent: Agent) -> list[dict[str, Any]]:
        return list(ReleaseGuard.objects.filter(agent=agent).values(
            "metric", "threshold", "window", "min_runs", "enabled", "last_checked_at", "last_value", "last_tripped_at"))


class ReleaseGateWriteSerializer(serializers.Serializer):
    evaluation_set = serializers.IntegerField(min_value=1, help_text="The id of an evaluation set of this agent's runs.")
    min_pass_rate = serializers.FloatField(min_value=0, max_value=1,
                                           help_text="The pass rate (0 to 1) the version's latest finished replay must reach.")
    model_mode = serializers.ChoiceField(choices=ModelMode.choices, default=ModelMode.RECORDED,
                                         help_text="The model mode that replay must have used.")
    checks = serializers.ListField(
        child=document_field(ReplayCheck), required=False, allow_empty=True,
        help_text="The checks a replay must have run (these or stricter) to count for the gate; omit to keep the gate's "
                  '(a new gate: [{"check": "same_tools"}, {"check": "same_terminal_reason"}]). Checked by the service.')
    enabled = serializers.BooleanField(default=True)


class ReleaseUpdateSerializer(serializers.Serializer):
    weights = serializers.DictField(child=serializers.IntegerField(), allow_empty=True, required=False,
                                    help_text='Version number -> weight, summing to 100, e.g. {"1": 90, "2": 10}; {} ends the release.')
    gate = ReleaseGateWriteSerializer(required=False, allow_null=True,
                                      help_text="Set the release gate (set first, then the weights); null removes it.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "weights" not in attrs and "gate" not in attrs:
            raise serializers.ValidationError({"weights": ["Give weights, a gate, or both."]})
        return attrs


class RollbackSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, help_text="The version number to take out of the release.")
    reason = serializers.CharField(required=False, allow_blank=True, max_length=300)

"""Admin for the catalog (read-only), installs, release weights, guards and tool rollouts.

No business logic: every change goes through ``marketplace.services`` (validated, audited).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest

from agents.admin import AgentAdmin
from core.documents import DocumentWidget
from marketplace import services
from marketplace.admin_inlines import OBSERVED_WINDOW, ReleaseWeightInline
from marketplace.catalog import catalog
from marketplace.gate_checks import ReplayCheck, check_problems, default_checks
from marketplace.models import Plugin, PluginInstall, PresetAgent, ReleaseGate, ReleaseGuard, ReleaseWeight, ToolRollout
from marketplace.release import observed_split
from tenants.admin_mixins import TenantScopedAdmin
from tenants.scoping import actor_for_user

# The gray release's weights are edited on the agent's page (agents/admin.py leaves the slot for them).
AgentAdmin.inlines = [*AgentAdmin.inlines, ReleaseWeightInline]


def _run_each(admin_: admin.ModelAdmin, request: HttpRequest, queryset: Any, fn: Callable[[Any], Any], done: str) -> None:
    """Call a service per selected row; report successes and each refusal in words."""
    ok = 0
    for obj in queryset:
        try:
            fn(obj)
            ok += 1
        except services.MarketplaceError as exc:
            admin_.message_user(request, f"{obj}: {exc}", messages.ERROR)
    if ok:
        admin_.message_user(request, f"{done}: {ok}.", messages.SUCCESS)


@admin.register(Plugin)
class PluginAdmin(admin.ModelAdmin):
    """The catalog as synced from code: the same for every tenant, read-only for everyone."""

    list_display = ["key", "version", "name", "source", "requires_install", "available", "synced_at"]
    list_filter = ["available", "source", "requires_install"]
    search_fields = ["key", "name", "description"]
    readonly_fields = [f.name for f in Plugin._meta.fields]

    def has_module_permission(self, request: HttpRequest) -> bool:
        actor = actor_for_user(request.user)
        return actor.is_superuser or bool(actor.roles)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class InstallForm(forms.ModelForm):
    plugin_key = forms.ChoiceField(label="Plugin", choices=())
    config = forms.JSONField(required=False, initial=dict, help_text="The tenant's settings (see the plugin's configuration schema).")

    class Meta:
        model = PluginInstall
        fields = ["tenant", "plugin_key", "config"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "plugin_key" in self.fields:  # the add form; on change it is read-only
            self.fields["plugin_key"].choices = [(s.key, f"{s.name} ({s.key} {s.version})") for s in catalog]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        key = data.get("plugin_key") or self.instance.plugin_key
        if not key:
            return data
        plugin = self.instance.plugin or self.instance.pending_plugin if self.instance.pk else None
        try:
            plugin = plugin or services.plugin_row(key)
            data["config"] = services.validated_config(plugin, data.get("config") or {})
        except services.InvalidConfig as exc:
            self.add_error("config", exc.errors)
        except services.MarketplaceError as exc:
            self.add_error("plugin_key", str(exc))
        tenant = data.get("tenant")
        if self.instance.pk is None and tenant is not None and PluginInstall.objects.filter(tenant=tenant, plugin_key=key).exists():
            self.add_error("plugin_key", f"{key} is already installed in {tenant}; select it in the list to upgrade or enable it.")
        return data


@admin.register(PluginInstall)
class PluginInstallAdmin(TenantScopedAdmin):
    form = InstallForm
    list_display = ["plugin_key", "tenant", "version_display", "status", "pending_display", "tool_names", "updated_at"]
    list_filter = ["status", "plugin_key", "tenant"]
    list_select_related = ["tenant", "plugin", "pending_plugin"]
    search_fields = ["plugin_key", "tenant__slug"]
    actions = ["upgrade", "accept_consent", "disable", "enable", "uninstall", "create_preset_agents"]
    readonly_fields = ["version_display", "pending_display", "status", "granted_scopes", "granted_hosts", "tool_names",
                       "installed_by", "installed_at", "consented_by", "consented_at", "updated_by", "updated_at"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["tenant", "plugin_key", "config"]
        return ["tenant", "plugin_key", *self.readonly_fields[:1], "config", *self.readonly_fields[1:]]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [*self.readonly_fields, "tenant", "plugin_key"] if obj is not None else []

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # uninstall with the action: it removes the tools too, and is audited

    @admin.display(description="version")
    def version_display(self, obj: PluginInstall) -> str:
        return obj.version or "(none consented yet)"

    @admin.display(description="waiting for consent")
    def pending_display(self, obj: PluginInstall) -> str:
        if obj.pending_plugin is None:
            return "-"
        plugin = obj.pending_plugin
        return f"{plugin.version}: scopes {', '.join(plugin.scopes) or 'none'}; hosts {', '.join(plugin.hosts) or 'none'}"

    @admin.display(description="tools")
    def tool_names(self, obj: PluginInstall) -> str:
        return ", ".join(sorted(obj.tools.values_list("name", flat=True))) or "-"

    def save_model(self, request: HttpRequest, obj: PluginInstall, form: Any, change: bool) -> None:
        config = form.cleaned_data.get("config") or {}
        # a refusal that raced past the form's checks is shown as a message (TenantScopedAdmin), not a 500
        if change:
            services.configure_plugin(install=obj, config=config, actor=self._actor(request))
            return
        install = services.install_plugin(tenant=obj.tenant, plugin_key=obj.plugin_key, actor=self._actor(request), config=config)
        obj.pk = install.pk
        if install.status == "pending_consent":
            self.message_user(request, f"{install.plugin_key} needs scopes or hosts: it waits for an owner to accept.", messages.WARNING)

    @admin.action(description="Upgrade to the catalog's version")
    def upgrade(self, request: HttpRequest, queryset: Any) -> None:
        _run_each(self, request, queryset, lambda i: services.upgrade_plugin(install=i, actor=self._actor(request)),
                  "Upgraded (or waiting for consent)")

    @admin.action(description="Accept consent (owners): grant the new scopes, hosts and tools")
    def accept_consent(self, request: HttpRequest, queryset: Any) -> None:
        _run_each(self, request, queryset, lambda i: services.accept_consent(install=i, actor=self._actor(request)), "Consent accepted")

    @admin.action(description="Disable (its tools become unavailable)")
    def disable(self, request: HttpRequest, queryset: Any) -> None:
        _run_each(self, request, queryset, lambda i: services.disable_plugin(install=i, actor=self._actor(request)), "Disabled")

    @admin.action(description="Enable")
    def enable(self, request: HttpRequest, queryset: Any) -> None:
        _run_each(self, request, queryset, lambda i: services.enable_plugin(install=i, actor=self._actor(request)), "Enabled")

    @admin.action(description="Uninstall (removes the plugin's tools)")
    def uninstall(self, request: HttpRequest, queryset: Any) -> None:
        _run_each(self, request, queryset, lambda i: services.uninstall_plugin(install=i, actor=self._actor(request)), "Uninstalled")

    @admin.action(description="Create agents from the plugin's presets")
    def create_preset_agents(self, request: HttpRequest, queryset: Any) -> None:
        def create(install: PluginInstall) -> None:
            for preset in (install.plugin.presets if install.plugin is not None else []):
                agent = services.create_agent_from_preset(tenant=install.tenant, plugin_key=install.plugin_key,
                                                          preset_slug=preset["slug"], actor=self._actor(request))
                self.message_user(request, f"Created agent {agent.slug} in {install.tenant}.")
            if install.plugin is None:
                raise services.PluginNotInstalled("waits for an owner's consent; its presets are not available yet.")

        _run_each(self, request, queryset, create, "Installs processed")


@admin.register(ReleaseWeight)
class ReleaseWeightAdmin(TenantScopedAdmin):
    """Weights are edited on the agent's page (they must add up to 100); here: the overview and instant rollback."""

    read_only = True
    list_display = ["agent", "version", "weight", "observed", "stable", "live_since", "updated_by", "updated_at", "tenant"]
    list_filter = ["tenant"]
    list_select_related = ["agent", "version", "tenant", "updated_by"]
    actions = ["rollback"]

    @admin.display(description=f"observed (last {OBSERVED_WINDOW} runs)")
    def observed(self, obj: ReleaseWeight) -> str:
        runs, percent = observed_split(obj.agent, last=OBSERVED_WINDOW).get(obj.version.number, (0, 0.0))
        return f"{percent:.1f}% ({runs})"

    @admin.display(boolean=True, description="stable")
    def stable(self, obj: ReleaseWeight) -> bool:
        return obj.agent.current_version_id == obj.version_id

    @admin.action(description="Roll back: set weight to 0, moving the share to the stable version")
    def rollback(self, request: HttpRequest, queryset: Any) -> None:
        _run_each(self, request, queryset,
                  lambda w: services.rollback_version(agent=w.agent, version=w.version, actor=self._actor(request),
                                                      reason="manual (admin)"),
                  "Rolled back")


class GuardForm(forms.ModelForm):
    def clean(self) -> dict[str, Any]:
        data = super().clean()
        metric, threshold = data.get("metric"), data.get("threshold")
        window, min_runs = data.get("window") or 0, data.get("min_runs") or 0
        if threshold is not None and metric and metric != "cost_per_run" and not 0 <= threshold <= 1:
            self.add_error("threshold", "A rate is a fraction from 0 to 1 (0.2 = 20 %).")
        if min_runs > window:
            self.add_error("min_runs", f"Must not exceed the window ({window}).")
        return data



@admin.register(ReleaseGuard)
class ReleaseGuardAdmin(TenantScopedAdmin):
    form = GuardForm
    list_display = ["agent", "metric", "threshold", "window", "min_runs", "enabled", "last_value", "last_checked_at",
                    "last_tripped_at", "tenant"]
    list_filter = ["metric", "enabled", "tenant"]
    list_select_related = ["agent", "tenant"]
    fields = ["agent", "metric", "threshold", "window", "min_runs", "enabled", "last_value", "last_checked_at", "last_tripped_at"]
    readonly_fields = ["last_value", "last_checked_at", "last_tripped_at"]
    actions = ["check_now"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [*self.readonly_fields, "agent", "metric"] if obj is not None else self.readonly_fields

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # switch a guard off instead: the change is audited

    def save_model(self, request: HttpRequest, obj: ReleaseGuard, form: Any, change: bool) -> None:
        guard = services.set_release_guard(agent=obj.agent, metric=obj.metric, threshold=obj.threshold, window=obj.window,
                                           min_runs=obj.min_runs, enabled=obj.enabled, actor=self._actor(request))
        obj.pk = guard.pk

    @admin.action(description="Check the selected guards now")
    def check_now(self, request: HttpRequest, queryset: Any) -> None:
        trips = services.check_release_guards(agent_ids=list(queryset.values_list("agent_id", flat=True)))
        for trip in trips:
            self.message_user(request, f"Rolled back v{trip.version}: {trip.metric} {trip.value:.3g} > {trip.threshold:g}.",
                              messages.WARNING)
        if not trips:
            self.message_user(request, "No guard tripped.")




class GateForm(forms.ModelForm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "checks" in self.fields:
            self.fields["checks"].widget = DocumentWidget(ReplayCheck)
            self.fields["checks"].required = False
            self.fields["checks"].help_text = ("A list of checks, each an object with the fields below; empty: "
                                               f"{json.dumps(default_checks())}. A replay counts for the gate only if it ran "
                                               "at least these (or stricter ones).")

    def clean_checks(self) -> Any:
        value = self.cleaned_data.get("checks")
        if value in (None, ""):
            return default_checks() if self.instance.pk is None else self.instance.checks
        stored, problems = check_problems(value)
        if problems:
            raise forms.ValidationError(problems)
        return stored

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        rate, agent, evaluation_set = data.get("min_pass_rate"), data.get("agent") or getattr(self.instance, "agent", None), \
            data.get("evaluation_set")
        if rate is not None and not 0 <= rate <= 1:
            self.add_error("min_pass_rate", "A pass rate is a fraction from 0 to 1 (0.95 = 95 %).")
        if agent is not None and evaluation_set is not None and evaluation_set.agent_id != agent.pk:
            self.add_error("evaluation_set", f"Pick a set of {agent.slug!r}'s runs; {evaluation_set.name!r} holds another agent's.")
        return data


@admin.register(ReleaseGate)
class ReleaseGateAdmin(TenantScopedAdmin):
    """Per agent: a version gets release weight only after a passed replay on the set (marketplace/gate.py)."""

    form = GateForm
    list_display = ["agent", "evaluation_set", "min_pass_rate", "model_mode", "enabled", "updated_by", "updated_at", "tenant"]
    list_filter = ["model_mode", "enabled", "tenant"]
    list_select_related = ["agent", "evaluation_set", "tenant", "updated_by"]
    fields = ["agent", "evaluation_set", "min_pass_rate", "model_mode", "checks", "enabled", "updated_by", "updated_at"]
    readonly_fields = ["updated_by", "updated_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [*self.readonly_fields, "agent"] if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ReleaseGate, form: Any, change: bool) -> None:
        gate = services.set_release_gate(agent=obj.agent, evaluation_set=obj.evaluation_set, min_pass_rate=obj.min_pass_rate,
                                         model_mode=obj.model_mode, enabled=obj.enabled, checks=obj.checks,
                                         actor=self._actor(request))
        obj.pk = gate.pk if gate is not None else None

    def delete_model(self, request: HttpRequest, obj: ReleaseGate) -> None:
        services.set_release_gate(agent=obj.agent, evaluation_set=None, actor=self._actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for gate in queryset.select_related("agent"):
            self.delete_model(request, gate)


@admin.register(ToolRollout)
class ToolRolloutAdmin(TenantScopedAdmin):
    list_display = ["tool", "enabled_percent", "tenant", "updated_by", "updated_at"]
    list_filter = ["tenant"]
    list_select_related = ["tool", "tenant", "updated_by"]
    fields = ["tool", "enabled_percent"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ["tool"] if obj is not None else []

    def save_model(self, request: HttpRequest, obj: ToolRollout, form: Any, change: bool) -> None:
        rollout = services.set_tool_rollout(tool=obj.tool, enabled_percent=obj.enabled_percent, actor=self._actor(request))
        obj.pk = rollout.pk if rollout is not None else None

    def delete_model(self, request: HttpRequest, obj: ToolRollout) -> None:
        services.set_tool_rollout(tool=obj.tool, enabled_percent=None, actor=self._actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for rollout in queryset.select_related("tool"):
            self.delete_model(request, rollout)


@admin.register(PresetAgent)
class PresetAgentAdmin(TenantScopedAdmin):
    read_only = True
    list_display = ["agent", "plugin_key", "preset_slug", "tenant", "created_at"]
    list_filter = ["plugin_key", "tenant"]
    list_select_related = ["agent", "tenant"]

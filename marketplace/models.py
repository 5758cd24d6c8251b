"""The plugin catalog as stored, per-tenant installs, and gray-release (rollout) configuration."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator
from django.db import models

from releases.models import ModelMode
from tenants.scoping import TenantOwned, TenantScopedQuerySet


class Plugin(models.Model):
    """One version of a plugin as declared in code. Written by ``sync_plugins`` only; read-only elsewhere."""

    key = models.SlugField(max_length=64)
    version = models.CharField(max_length=32)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    source = models.CharField(max_length=200, default="builtin", help_text="builtin, or entry_point:<distribution>.")
    tools = models.JSONField(default=list, blank=True, help_text="[{key, name, category, requires_approval, overrides}]")
    presets = models.JSONField(default=list, blank=True, help_text="Agent presets: slug, name, system prompt, model, tools, policy.")
    scopes = models.JSONField(default=list, blank=True)
    hosts = models.JSONField(default=list, blank=True, help_text="Outbound hosts the plugin's tools reach.")
    config_schema = models.JSONField(default=dict, blank=True, help_text="JSON Schema of a tenant's configuration.")
    requires_install = models.BooleanField(default=True)
    available = models.BooleanField(default=True, help_text="Still provided by the running code (false: removed or superseded).")
    synced_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["key", "-synced_at"]
        constraints = [models.UniqueConstraint(fields=["key", "version"], name="plugin_key_version_unique")]

    def __str__(self) -> str:
        return f"{self.key} {self.version}"

    def tool_keys(self) -> list[str]:
        return [t["key"] for t in self.tools]

    def tool_names(self) -> list[str]:
        return [t["name"] for t in self.tools]

    def preset(self, slug: str) -> dict | None:
        return next((p for p in self.presets if p["slug"] == slug), None)


class InstallStatus(models.TextChoices):
    INSTALLED = "installed", "Installed"
    PENDING_CONSENT = "pending_consent", "Waiting for an owner's consent"
    DISABLED = "disabled", "Disabled"


#: Install states whose (consented) tools agents may use.
ACTIVE_INSTALL_STATUSES = (InstallStatus.INSTALLED, InstallStatus.PENDING_CONSENT)


class PluginInstall(TenantOwned):
    """A plugin installed in a tenant.

    ``plugin`` is the consented version whose tools are live. An upgrade needing new consent sets
    ``pending_plugin`` and the status ``pending_consent``; the live version keeps working meanwhile.
    A first install waiting for consent has no ``plugin`` yet (and no tools).
    """

    plugin_key = models.SlugField(max_length=64)
    plugin = models.ForeignKey(Plugin, null=True, blank=True, on_delete=models.PROTECT, related_name="installs",
                               help_text="The consented version in use.")
    pending_plugin = models.ForeignKey(Plugin, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                       help_text="The version waiting for an owner's consent.")
    status = models.CharField(max_length=16, choices=InstallStatus.choices, default=InstallStatus.INSTALLED, db_index=True)
    config = models.JSONField(default=dict, blank=True)
    granted_scopes = models.JSONField(default=list, blank=True)
    granted_hosts = models.JSONField(default=list, blank=True)
    installed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    installed_at = models.DateTimeField(auto_now_add=True)
    consented_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    consented_at = models.DateTimeField(null=True, blank=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "plugin_key"]
        constraints = [models.UniqueConstraint(fields=["tenant", "plugin_key"], name="one_install_per_plugin_and_tenant")]

    def __str__(self) -> str:
        return f"{self.plugin_key} {self.version or '(not consented)'}"

    @property
    def version(self) -> str:
        return self.plugin.version if self.plugin is not None else ""


class PresetAgent(TenantOwned):
    """Remembers that an agent was made from a plugin's preset: its runs need the plugin installed."""

    agent = models.OneToOneField("agents.Agent", on_delete=models.CASCADE, related_name="preset_origin")
    plugin_key = models.SlugField(max_length=64)
    preset_slug = models.SlugField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.agent_id} from {self.plugin_key}/{self.preset_slug}"


class ReleaseWeight(TenantOwned):
    """Share of an agent's new sessions that get this version (the weights of an agent sum to 100)."""

    agent = models.ForeignKey("agents.Agent", on_delete=models.CASCADE, related_name="release_weights")
    version = models.ForeignKey("agents.AgentVersion", on_delete=models.CASCADE, related_name="release_weights")
    weight = models.PositiveSmallIntegerField(validators=[MaxValueValidator(100)])
    live_since = models.DateTimeField(null=True, blank=True, help_text="When its weight last went above 0 (a guard's window starts here).")
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["agent", "version__number"]
        constraints = [models.UniqueConstraint(fields=["agent", "version"], name="one_weight_per_agent_version")]

    def __str__(self) -> str:
        return f"{self.version} at {self.weight}%"


class GuardMetric(models.TextChoices):
    ERROR_RATE = "error_rate", "Error rate (runs ending in error or timeout)"
    REJECTION_RATE = "rejection_rate", "Rejection rate (runs ending rejected)"
    COST_PER_RUN = "cost_per_run", "Average cost per run"
    CHECKS = "checks", "Share of live runs failing the release gate's checks"


class ReleaseGuard(TenantOwned):
    """Automatic rollback: a candidate version whose metric passes the threshold goes back to 0 %."""

    agent = models.ForeignKey("agents.Agent", on_delete=models.CASCADE, related_name="release_guards")
    metric = models.CharField(max_length=16, choices=GuardMetric.choices)
    threshold = models.FloatField(help_text="Rates are fractions (0.2 = 20 %); cost is in the price table's currency.")
    window = models.PositiveIntegerField(default=50, help_text="Look at the candidate's last N finished runs.")
    min_runs = models.PositiveIntegerField(default=10, help_text="Decide only once the candidate has this many finished runs.")
    enabled = models.BooleanField(default=True)
    last_checked_at = models.DateTimeField(null=True, blank=True)
    last_tripped_at = models.DateTimeField(null=True, blank=True)
    last_value = models.FloatField(null=True, blank=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["agent", "metric"]
        constraints = [models.UniqueConstraint(fields=["agent", "metric"], name="one_guard_per_agent_metric")]

    def __str__(self) -> str:
        return f"{self.agent} {self.metric} > {self.threshold:g}"


def default_gate_checks() -> list[dict[str, Any]]:
    """A gate's checks unless it names others (and those migration 0003 gave the gates set before gates had checks)."""
    from marketplace.gate_checks import default_checks  # not at import: the models load before the replay's modules

    return default_checks()


class ReleaseGate(TenantOwned):
    """A release weight above 0 for a version other than the stable one needs a passed replay batch of that version
    on ``evaluation_set`` (in ``model_mode``, pass rate at least ``min_pass_rate``); see ``marketplace/gate.py``."""

    agent = models.OneToOneField("agents.Agent", on_delete=models.CASCADE, related_name="release_gate")
    evaluation_set = models.ForeignKey("releases.EvaluationSet", on_delete=models.PROTECT, related_name="gates")
    min_pass_rate = models.FloatField(help_text="The pass rate a version's latest finished replay on the set must reach "
                                                "(a fraction from 0 to 1: 0.95 = 95 %).")
    model_mode = models.CharField(max_length=16, choices=ModelMode.choices, default=ModelMode.RECORDED,
                                  help_text="The model mode the replay must have used.")
    checks = models.JSONField(default=default_gate_checks,
                              help_text="The checks a replay must have run (these or stricter) to count for the gate "
                                        "(marketplace/gate_checks.py).")
    enabled = models.BooleanField(default=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["agent"]

    def __str__(self) -> str:
        return f"gate of {self.agent}: {self.evaluation_set} ≥ {self.min_pass_rate:g} ({self.model_mode})"


class ToolRollout(TenantOwned):
    """Gray release of a tool: enabled for this share of sessions (sticky per session)."""

    tool = models.OneToOneField("tools.Tool", on_delete=models.CASCADE, related_name="rollout")
    enabled_percent = models.PositiveSmallIntegerField(validators=[MaxValueValidator(100)])
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "tool__name"]

    def __str__(self) -> str:
        return f"{self.tool} for {self.enabled_percent}% of sessions"

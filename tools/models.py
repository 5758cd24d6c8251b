"""The tool registry as operators see it: one row per tool a tenant's agents may be given."""

from __future__ import annotations

from django.db import models

from tenants.scoping import TenantOwned, TenantScopedQuerySet


class ToolKind(models.TextChoices):
    PYTHON = "python", "Python function"
    HTTP = "http", "HTTP endpoint"
    MCP = "mcp", "MCP server tool"
    AGENT = "agent", "Another agent"


class ToolCategory(models.TextChoices):
    READ = "read", "Read"
    WRITE = "write", "Write (side effects)"


class Tool(TenantOwned):
    name = models.CharField(max_length=64, help_text="What the model calls it: letters, digits, _ and -.")
    description = models.TextField(help_text="When to use it and when not to. The model reads this.")
    kind = models.CharField(max_length=16, choices=ToolKind.choices, default=ToolKind.PYTHON)
    parameters = models.JSONField(default=dict, blank=True, help_text="JSON Schema of the arguments.")
    output_schema = models.JSONField(default=dict, blank=True)
    config = models.JSONField(default=dict, blank=True, help_text="Kind-specific: the function key, the endpoint...")
    category = models.CharField(max_length=8, choices=ToolCategory.choices, default=ToolCategory.READ)
    idempotent = models.BooleanField(default=True)
    required_scopes = models.JSONField(default=list, blank=True)
    requires_approval = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True, help_text="The kill switch: a disabled tool is refused at once.")
    timeout_seconds = models.FloatField(default=10.0)
    rate_limit_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Calls per minute per tenant for this tool; empty means no limit.")
    result_fields = models.JSONField(default=list, blank=True, help_text="Whitelist of result fields; empty keeps all.")
    summary_template = models.TextField(blank=True)
    result_size_cap = models.PositiveIntegerField(default=8000)
    sensitive_fields = models.JSONField(default=list, blank=True)
    plugin_install = models.ForeignKey(
        "marketplace.PluginInstall", null=True, blank=True, on_delete=models.CASCADE, related_name="tools",
        help_text="The plugin install that provided this tool; empty for the tenant's own tools.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    approval_policy = models.JSONField(
        default=dict, blank=True,
        help_text='When calls need a human: {"mode": "always"|"never"|"condition", "condition": {"field": "amount", '
                  '"op": ">", "value": 100}, "expires_in_seconds": 3600, "approver_roles": ["approver", "owner"], '
                  '"four_eyes": false}. Empty follows requires_approval.',
    )

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="tool_name_unique_per_tenant")]
        permissions = [("approve_tool", "Can approve calls of this tool")]

    def __str__(self) -> str:
        return self.name

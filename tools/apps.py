import importlib

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from egress.guard import allow_list_problems


class ToolsConfig(AppConfig):
    name = "tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Site-specific tool modules (AGENTOPS_EXTRA_TOOL_MODULES) register their @tool functions at start-up.
        for module in getattr(settings, "AGENTOPS_EXTRA_TOOL_MODULES", []):
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"AGENTOPS_EXTRA_TOOL_MODULES names {module!r}, which cannot be imported ({exc}). "
                    "Fix the module path or remove it from the variable."
                ) from exc
        _check_egress_allow_lists()


def _check_egress_allow_lists() -> None:
    """A bad egress allow-list entry stops start-up, naming the variable (the guard would otherwise ignore it)."""
    for name, entries in (("TOOL_EGRESS_ALLOW", list(getattr(settings, "TOOL_EGRESS_ALLOW", []))),
                          ("PROVIDER_EGRESS_ALLOW", list(getattr(settings, "PROVIDER_EGRESS_ALLOW", [])))):
        problems = allow_list_problems(entries)
        if problems:
            raise ImproperlyConfigured(f"{name} (comma-separated): " + "; ".join(problems))

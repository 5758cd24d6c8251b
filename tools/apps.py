import importlib

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


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

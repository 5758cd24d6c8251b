from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The catalog is filled once, from code only (no database here), then frozen.
        from marketplace.builtin import register_builtins
        from marketplace.catalog import catalog
        from marketplace.sync import sync_after_migrate

        if not catalog.frozen:
            register_builtins(catalog)
            catalog.load_entry_points()
            catalog.freeze()
        post_migrate.connect(sync_after_migrate, sender=self, dispatch_uid="marketplace.sync_after_migrate")
        # The agents layer asks the marketplace through hooks it cannot import (agents/hooks.py).
        from agents.hooks import register_marketplace
        from marketplace import access, gate, release

        register_marketplace(
            resolvable_tools=access.resolvable_tools,
            tool_allowed_for=access.tool_allowed_for,
            granted_scopes=access.granted_scopes,
            version_for_session=lambda agent, session_id: release.version_for_session(agent=agent, session_id=session_id),
            admit_current=gate.admit_current,
        )

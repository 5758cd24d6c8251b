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

from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Built-in plugins register their Python tools at start-up.
        import marketplace.builtin.order_desk  # noqa: F401

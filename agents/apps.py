from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The extension table's allow-list comes from the settings; the table itself is read on first use
        # (a broken plugin is reported by the agentops.W002 check, never a crash).
        from django.core.signals import setting_changed

        from agents import extensions

        extensions.configure_from_settings()
        setting_changed.connect(extensions.on_setting_changed, dispatch_uid="agents.extensions.setting_changed")

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

        # The tool layer asks the agents layer through handlers it cannot import (tools/handlers.py).
        from agents import child_runs, services, shadow
        from tools.handlers import register_agents

        register_agents(run_child=child_runs.run_child, agent_slugs=child_runs.agent_slugs,
                        agent_exists=child_runs.agent_exists, agents_using=child_runs.agents_using,
                        resume_waiting_run=services.resume_waiting_run, preview_tool_impact=shadow.preview_tool_change)

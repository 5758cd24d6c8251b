from django.apps import AppConfig


class FlowsConfig(AppConfig):
    name = "flows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # agents.execute_run hands flow runs to the runner through a handler it cannot import (agents/flow_hook.py).
        from agents.flow_hook import register_flow_runner
        from flows.runner import run_flow

        register_flow_runner(run_flow)

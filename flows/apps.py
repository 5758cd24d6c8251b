from django.apps import AppConfig


class FlowsConfig(AppConfig):
    name = "flows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # agents.execute_run hands flow runs to the runner through a handler it cannot import (agents/flow_hook.py).
        from agents.capacity import register_node_counter
        from agents.erasure import register_eraser
        from agents.flow_hook import register_flow_runner
        from flows.erasure import erase_nodes
        from flows.models import live_nodes
        from flows.runner import run_flow

        register_flow_runner(run_flow)
        register_eraser("flow_nodes", erase_nodes)  # a session's erasure covers its flow runs' node rows
        register_node_counter(live_nodes)  # a tenant's running nodes count against its bound on running work

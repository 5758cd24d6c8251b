from __future__ import annotations

from celery import shared_task


@shared_task(name="flows.execute_node", acks_late=True, ignore_result=True)
def execute_node_task(run_id: str, node_id: str, token: str) -> None:
    from flows.runner import execute_node

    execute_node(run_id, node_id, token)

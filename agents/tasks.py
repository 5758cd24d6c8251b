from __future__ import annotations

from celery import shared_task

from agents import services


@shared_task(name="agents.execute_run", acks_late=True, ignore_result=True)
def execute_run_task(run_id: str) -> None:
    services.execute_run(run_id)

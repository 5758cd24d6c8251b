from __future__ import annotations

from celery import shared_task

from agents import services


@shared_task(name="agents.execute_run", acks_late=True, ignore_result=True)
def execute_run_task(run_id: str) -> None:
    services.execute_run(run_id)


@shared_task(name="agents.sweep_runs", ignore_result=True)
def sweep_runs_task() -> int:
    """Celery beat runs this every SWEEP_INTERVAL_SECONDS (config/settings.py: CELERY_BEAT_SCHEDULE)."""
    from agents.sweeper import sweep_runs

    return sweep_runs().requeued

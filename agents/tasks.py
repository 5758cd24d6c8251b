from __future__ import annotations

from celery import shared_task

from agents import services
from core.joblock import job_lock


@shared_task(name="agents.execute_run", acks_late=True, ignore_result=True)
def execute_run_task(run_id: str, parked: int = 0) -> None:
    """``parked``: how many times in a row the run was parked (its tenant at its bound, agents/capacity.py)."""
    services.execute_run(run_id, parked=parked)


@shared_task(name="agents.sweep_runs", ignore_result=True)
def sweep_runs_task() -> int:
    """Celery beat runs this every SWEEP_INTERVAL_SECONDS (config/settings.py: CELERY_BEAT_SCHEDULE).

    A second beat's copy finds the job's lock held and does nothing (and would re-enqueue nothing twice anyway)."""
    from agents.sweeper import sweep_runs

    with job_lock("agents.sweep_runs") as mine:
        return sweep_runs().requeued if mine else 0

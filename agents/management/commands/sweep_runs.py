"""``manage.py sweep_runs``: re-enqueue runs whose worker died or whose enqueue was lost, once or in a loop."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from agents.sweeper import sweep_runs


class Command(BaseCommand):
    help = (
        "Re-enqueue stranded runs: running with an expired lease (the worker died) and queued with no "
        "worker for SWEEP_QUEUED_AFTER_SECONDS (the enqueue was lost). Celery beat does this every "
        "SWEEP_INTERVAL_SECONDS; use this from cron or by hand instead."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--loop", action="store_true", help="Keep sweeping every SWEEP_INTERVAL_SECONDS until stopped.")

    def handle(self, *args: Any, loop: bool, **options: Any) -> None:
        while True:
            report = sweep_runs()
            self.stdout.write(
                f"re-enqueued {report.requeued} run(s): {len(report.lease_expired)} with an expired lease, "
                f"{len(report.lost_enqueue)} queued without a worker"
            )
            if not loop:
                return
            time.sleep(settings.SWEEP_INTERVAL_SECONDS)

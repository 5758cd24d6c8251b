"""``manage.py mask_stored_answers [--dry-run]``: mask the answers stored before answers were masked (issue #49 item 8).

Runs' ``output`` and the session turns' ``assistant_message`` are masked when they are stored (``agents/store.py``,
the rule of the trace and the deltas: ``audit.masking.mask_text``). Rows written before that hold the model's text
raw; this masks them in place, a chunk at a time, once after the upgrade. Masking is idempotent, so a second run
changes nothing. Each row is written only if it still holds what was read (an erasure meanwhile wins).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import models

from agents.models import Run, RunStatus, Turn
from audit.masking import mask_text

CHUNK = 500


def _mask_column(queryset: models.QuerySet[Any], field: str, *, write: bool) -> tuple[int, int]:
    """(rows read, rows whose text masking changed) over ``queryset``'s non-empty ``field``, by primary key."""
    seen = changed = 0
    last: Any = None
    rows = queryset.exclude(**{field: ""}).order_by("pk")
    while True:
        page = list((rows if last is None else rows.filter(pk__gt=last)).values_list("pk", field)[:CHUNK])
        if not page:
            return seen, changed
        for pk, text in page:
            masked = mask_text(text)
            if masked != text:
                changed += 1
                if write:
                    queryset.model.objects.filter(pk=pk, **{field: text}).update(**{field: masked})
        seen += len(page)
        last = page[-1][0]


class Command(BaseCommand):
    help = "Mask secrets and personal data in runs' answers and session turns stored before answers were masked."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Count what would change; write nothing.")

    def handle(self, *args: Any, dry_run: bool, **options: Any) -> None:
        write = not dry_run
        runs = _mask_column(Run.objects.filter(status=RunStatus.FINISHED), "output", write=write)
        turns = _mask_column(Turn.objects.all(), "assistant_message", write=write)
        verb = "would mask" if dry_run else "masked"
        self.stdout.write(f"runs: {runs[0]} answers read, {verb} {runs[1]}; "
                          f"turns: {turns[0]} answers read, {verb} {turns[1]}")

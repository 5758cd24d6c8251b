"""Erasing a session's runs from replay results (``agents/erasure.py``).

A result keeps its verdict (status, passed, regression, tokens, cost, latency) and the names of the aspects that
changed (the batch's tallies read them), and loses the diff's content (recorded and replayed answers, tool calls with
their arguments, cassette misses) and any error text (an exception's message may quote the run): its error says it was
erased instead. The evaluation sets keep the run as a member: later replays report it as erased.
"""

from __future__ import annotations

from typing import Any

from releases.models import ReplayRun

#: A result's error text once its run is erased.
ERASED_RESULT = "the recorded run was erased; this result's details went with it"


def erase_results(run_ids: list[Any]) -> int:
    rows = list(ReplayRun.objects.filter(source_run_id__in=run_ids).only("pk", "diff", "error"))
    for row in rows:
        changed = row.diff.get("changed") if isinstance(row.diff, dict) else None
        row.diff = {"changed": [c for c in changed if isinstance(c, str)] if isinstance(changed, list) else [], "erased": True}
        row.error = ERASED_RESULT  # says why the report shows no details (and replaces any error text)
    ReplayRun.objects.bulk_update(rows, ["diff", "error"], batch_size=500)
    return len(rows)

"""Time left on an approval request, as a person reads it: "45 s", "58 min", "1 h 5 min", "2 d 3 h".

Whole units, rounded down (a request with 3532 s left has "58 min" left, not 59). ``static/approvals/timeleft.js``
renders the same text in the browser as the seconds run down; keep the two in step.
"""

from __future__ import annotations


def humanize_seconds(seconds: float | int | None) -> str:
    total = max(0, int(seconds or 0))
    if total < 60:
        return f"{total} s"
    minutes, _ = divmod(total, 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"

"""Late-bound slots, and a start-up check that every one is filled.

A lower layer that must ask the one above it (tools asks agents to start a child run; agents asks the marketplace which
tools a tenant may resolve, and the flows app to run a flow) holds a slot that the upper app fills in its
``AppConfig.ready()`` (dependency inversion, not an upward import). Each holder declares here how to list its empty
slots; :func:`unfilled_slots` is a Django system check (``manage.py check``, ``migrate``, ``serve``) that fails
start-up while any is empty, naming the slot and the app that should fill it — never a silent default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.checks import Error, Tags, register

#: (holder module, the app that fills it, () -> the names of its empty slots)
_HOLDERS: list[tuple[str, str, Callable[[], list[str]]]] = []


def declare(holder: str, filled_by: str, missing: Callable[[], list[str]]) -> None:
    """Called once by a slot holder at import; ``missing`` lists its slots no app filled."""
    if all(h != holder for h, _, _ in _HOLDERS):
        _HOLDERS.append((holder, filled_by, missing))


@register(Tags.compatibility)
def unfilled_slots(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    return [
        Error(
            f"{holder}: {', '.join(empty)} not registered, so that part of the console would not work.",
            hint=f"The {filled_by!r} app registers it in its AppConfig.ready(); keep {filled_by!r} in INSTALLED_APPS "
                 "and its ready() intact.",
            id="agentops.E002",
        )
        for holder, filled_by, missing in _HOLDERS
        if (empty := missing())
    ]

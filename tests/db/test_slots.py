"""Issue #52: an upward call's slot left empty is a start-up error (the agentops.E002 system check), never a silent
default. Before, an unregistered handler answered "as if there were no agents" (a flow's tool of the agent kind, a
tenant's tool list without the marketplace's rules)."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from agents import capacity, flow_hook, hooks
from core.slots import unfilled_slots
from tools import handlers


def test_every_slot_is_filled_at_start_up() -> None:
    assert unfilled_slots() == []
    call_command("check")  # raises SystemCheckError on any error


@pytest.mark.parametrize(("holder", "name", "where", "app"), [
    (handlers.agents, "run_child", "tools.handlers", "agents"),
    (hooks.marketplace, "tool_allowed_for", "agents.hooks", "marketplace"),
    (flow_hook, "_runner", "agents.flow_hook", "flows"),
    (capacity, "_node_counter", "agents.capacity", "flows"),
])
def test_an_empty_slot_stops_start_up_naming_it_and_its_app(holder: object, name: str, where: str, app: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holder, name, None)
    errors = [e for e in run_checks() if e.id == "agentops.E002"]
    assert len(errors) == 1 and errors[0].msg.startswith(f"{where}: ") and f"{app!r}" in errors[0].hint, errors
    with pytest.raises(SystemCheckError, match=r"agentops\.E002"):
        call_command("check")

"""The flow runner, registered at start-up by the ``flows`` app above (``FlowsConfig.ready()``).

``agents`` imports nothing from ``flows`` (see .importlinter): ``services.execute_run`` hands a run whose agent is a
flow to the registered runner, with the lease it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core import slots

#: (run, lease_token) -> whether the run ended in this call (its end committed, its lease given back): runs the flow's
#: ready nodes until it finishes or waits.
_runner: Callable[[Any, str], bool] | None = None
slots.declare("agents.flow_hook", "flows", lambda: ["the flow runner"] if _runner is None else [])


def register_flow_runner(runner: Callable[[Any, str], bool]) -> None:
    global _runner
    _runner = runner


def run_flow(run: Any, token: str) -> bool:
    if _runner is None:
        raise RuntimeError("no flow runner registered: the flows app is not installed")
    return bool(_runner(run, token))

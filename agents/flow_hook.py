"""The flow runner, registered at start-up by the ``flows`` app above (``FlowsConfig.ready()``).

``agents`` imports nothing from ``flows`` (see .importlinter): ``services.execute_run`` hands a run whose agent is a
flow to the registered runner, with the lease it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: (run, lease_token) -> None: runs the flow's ready nodes until it finishes or waits.
_runner: Callable[[Any, str], None] | None = None


def register_flow_runner(runner: Callable[[Any, str], None]) -> None:
    global _runner
    _runner = runner


def run_flow(run: Any, token: str) -> None:
    if _runner is None:
        raise RuntimeError("no flow runner registered: the flows app is not installed")
    _runner(run, token)

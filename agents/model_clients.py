"""Which ModelClient a run talks to. ``demo/*`` models are the deterministic planner."""

from __future__ import annotations

from typing import Any

from agents.runtime.protocols import ModelClient


def model_client_for(run: Any) -> ModelClient:
    from agents.llm.planner import DeterministicPlanner

    provider, _, _model = run.version.model.partition("/")
    if provider == "demo":
        return DeterministicPlanner(model=run.version.model)
    raise ValueError(f"No provider {provider!r} is configured for model {run.version.model!r}.")


def model_info_for(run: Any) -> Any:
    return None

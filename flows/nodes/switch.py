"""A switch node: the first case whose condition holds chooses its nodes, else the default (``runtime.flows.choose``);
the unchosen branches are skipped by the plan."""

from __future__ import annotations

from typing import Any

from jmespath.exceptions import JMESPathError

from flows.nodes.base import Attempt, NodeFailed
from runtime.flows import choose


def run(a: Attempt) -> tuple[dict[str, Any], list[str]]:
    """``({"chosen": [...]}, chosen)``: the node's output and its row's ``chosen``."""
    try:
        chosen = choose(a.node, a.scope)
    except (JMESPathError, ValueError) as exc:  # a type error in a condition (abs of a text), a value too large
        raise NodeFailed(f"a case's condition could not be evaluated: {exc}") from None
    return {"chosen": chosen}, chosen

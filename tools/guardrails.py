"""The prompt-injection filter on a run's user input, configured per tenant and per agent.

The setting lives on the tenant (the runtime policy refuses unknown keys)::

    tenant.settings["prompt_injection"] = {"mode": "flag", "agents": {"refunds": "block"}}

``mode`` is the tenant's default, an agent's entry overrides it; each is ``flag`` (the default),
``block`` or ``off``:

- ``block``: the run is refused before anything is stored, with a message naming what was found;
- ``flag``: the run goes ahead and the matches are kept in ``run.facts["injection_flags"]`` (a
  business key, so it is in the run's state too, never in the model's messages; not ``_``-prefixed
  because the runtime refuses such business keys);
- ``off``: nothing is checked.

Detection is :func:`audit.masking.detect_injection` (known phrasings, English and Chinese).
Facts a client sends under the console's own keys (:data:`RESERVED_FACTS`) are dropped: a client
cannot pre-set flags or pretend a run is a sub-agent's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from audit.masking import InjectionMatch, detect_injection

log = logging.getLogger(__name__)

MODES = ("flag", "block", "off")
DEFAULT_MODE = "flag"
FLAGS_KEY = "injection_flags"
#: Facts only the console writes.
#: ``awaiting_child`` names the sub-agent run a supervisor waits for (agents/supervisor.py): a client that set it
#: could make its own run's cancellation reach another run.
RESERVED_FACTS = frozenset({FLAGS_KEY, "agent_depth", "parent_run", "parent_agent", "awaiting_child", "parent_flow", "flow_node"})
_LABEL_WORDS = {
    "ignore_instructions": "an instruction to ignore the assistant's instructions",
    "reveal_system_prompt": "a request to reveal the system prompt",
}


class InjectionRefused(Exception):
    """The input was blocked; the message is for the user who sent it."""


def injection_mode(settings: Mapping[str, Any] | None, agent_slug: str) -> str:
    """The mode for ``agent_slug`` under a tenant's settings; a bad value falls back to ``flag``, logged."""
    section = (settings or {}).get("prompt_injection")
    if section is None:
        return DEFAULT_MODE
    if not isinstance(section, Mapping):
        log.warning("tenant setting prompt_injection must be an object; using %r", DEFAULT_MODE)
        return DEFAULT_MODE
    agents = section.get("agents") or {}
    mode = agents.get(agent_slug) if isinstance(agents, Mapping) and agent_slug in agents else section.get("mode", DEFAULT_MODE)
    if mode not in MODES:
        log.warning("prompt_injection mode %r for agent %r is not one of %s; using %r", mode, agent_slug, MODES, DEFAULT_MODE)
        return DEFAULT_MODE
    return str(mode)


@dataclass(frozen=True)
class Screening:
    mode: str
    matches: list[InjectionMatch]

    @property
    def blocked(self) -> bool:
        return self.mode == "block" and bool(self.matches)

    def flags(self) -> list[dict[str, Any]]:
        return [{"label": m.label, "text": m.text, "start": m.start, "end": m.end} for m in self.matches]

    def message(self) -> str:
        first = self.matches[0]
        what = _LABEL_WORDS.get(first.label, first.label.replace("_", " "))
        return (f"This message was not accepted: it contains {what} ({first.label}: {first.text!r}), which this agent "
                "does not allow. Rephrase the request without instructions about the assistant's rules or prompt.")


def screen(text: str, *, settings: Mapping[str, Any] | None, agent_slug: str) -> Screening:
    mode = injection_mode(settings, agent_slug)
    return Screening(mode, [] if mode == "off" else detect_injection(text or ""))


def screen_facts(text: str, facts: Mapping[str, Any] | None, *, settings: Mapping[str, Any] | None,
                 agent_slug: str) -> dict[str, Any]:
    """The run's facts after screening ``text``: reserved keys dropped, flags added; raises :class:`InjectionRefused`."""
    clean = {k: v for k, v in (facts or {}).items() if k not in RESERVED_FACTS}
    result = screen(text, settings=settings, agent_slug=agent_slug)
    if result.blocked:
        raise InjectionRefused(result.message())
    if result.matches:
        clean[FLAGS_KEY] = result.flags()
    return clean

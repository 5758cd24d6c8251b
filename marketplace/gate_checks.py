"""The release gate's own checks (issue #49 hole 5): what a replay batch must have judged to count for the gate.

A gate names its checks (``ReleaseGate.checks``, a list of :class:`ReplayCheck` documents, the same check names and
parameters a replay takes: ``releases.diffs.CHECKS``). A finished replay batch counts for the gate only if it ran at
least them: every gate check is matched by one of the batch's checks that is the same or stricter. Otherwise a
batch with one check that cannot fail (``answer_not_contains "zz"``) would pass a version whose every run changed.

Same or stricter, check by check (what passing the batch's check implies about the gate's):

- the same check with no parameter; ``no_diff`` also covers ``same_tools``, ``same_terminal_reason``,
  ``same_answer``, ``no_new_approvals`` and ``cost_at_most`` / ``steps_at_most`` with ``times`` of at least 1;
- ``answer_contains`` with a text that contains the gate's text (an answer holding it holds the gate's);
- ``answer_not_contains`` with a text the gate's text contains (an answer without it is without the gate's);
- ``cost_at_most`` / ``steps_at_most`` with ``times`` at most the gate's.

A batch that names no checks ran ``releases.diffs.DEFAULT_CHECKS`` (as ``run_checks`` does).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from releases.diffs import CHECKS, DEFAULT_CHECKS, MAX_TIMES
from runtime.documents import Document, choice, number, problem, problems
from runtime.documents import text as non_empty_text

#: The most checks a gate names, and the longest text one takes (a tenant's input, judged on every replayed run).
MAX_GATE_CHECKS = 20
MAX_CHECK_TEXT = 1000
#: How many of a version's latest finished batches on the set are looked at for one that ran the gate's checks.
BATCHES_LOOKED_AT = 50

_NO_DIFF_COVERS = ("same_tools", "same_terminal_reason", "same_answer", "no_new_approvals")
_TIMES = ("cost_at_most", "steps_at_most")


class ReplayCheck(Document):
    """One check of the gate: a name of ``releases.diffs.CHECKS`` and the parameter that check takes, if any."""

    check: Annotated[str, choice(*CHECKS), Field(description="the check's name")]
    text: Annotated[str | None, non_empty_text(nullable=True), Field(description="answer_contains / answer_not_contains: the text")] = None
    times: Annotated[float | None, number(nullable=True, maximum=MAX_TIMES),
                     Field(description="cost_at_most / steps_at_most: at most this many times the recording (1.5 = 150 %)")] = None

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise problem('must be an object like {"check": "same_tools"} or {"check": "answer_contains", "text": "..."}', value)
        return value

    @field_validator("text")
    @classmethod
    def _short(cls, value: str | None) -> str | None:
        if value is not None and len(value) > MAX_CHECK_TEXT:
            raise problem(f"must be at most {MAX_CHECK_TEXT} characters long; got {len(value)}")
        return value

    @model_validator(mode="after")
    def _its_parameter(self) -> ReplayCheck:
        wanted = CHECKS[self.check]
        for param in ("text", "times"):
            given = getattr(self, param) is not None
            if param == wanted and not given:
                raise problem(f"{self.check} needs {param!r}", at=f".{param}")
            if param != wanted and given:
                raise problem(f"{self.check} takes no {param!r}", at=f".{param}")
        return self

    def stored(self) -> dict[str, Any]:
        """As a replay batch stores its checks: the name and only the parameter the check takes."""
        return self.model_dump(mode="json", exclude_none=True)


class GateChecks(Document):
    """A gate's ``checks``: at least one, at most ``MAX_GATE_CHECKS``."""

    checks: list[ReplayCheck]

    @field_validator("checks", mode="before")
    @classmethod
    def _a_list(cls, value: Any) -> Any:
        if not isinstance(value, list) or not value:
            raise problem(f'must be a non-empty list of checks, e.g. {json.dumps(default_checks())}', value)
        if len(value) > MAX_GATE_CHECKS:
            raise problem(f"must hold at most {MAX_GATE_CHECKS} checks; got {len(value)}")
        return value


def default_checks() -> list[dict[str, Any]]:
    """A gate's checks unless it names others: the replay's own default, so a replay started without checks counts."""
    return [dict(c) for c in DEFAULT_CHECKS]


def check_problems(value: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """``(the checks as stored, [])`` or ``([], every problem as 'checks[1].text: ...')``."""
    document, found = problems(GateChecks, {"checks": value})
    if document is None:
        return [], found
    return [c.stored() for c in document.checks], []


def _covers(have: Any, need: dict[str, Any]) -> bool:
    if not isinstance(have, dict):
        return False
    name, got = need["check"], have.get("check")
    try:
        if got == name:
            if name == "answer_contains":
                return need["text"] in str(have["text"])
            if name == "answer_not_contains":
                return str(have["text"]) in need["text"]
            if name in _TIMES:
                return float(have["times"]) <= float(need["times"])
            return True
        return got == "no_diff" and (name in _NO_DIFF_COVERS or (name in _TIMES and float(need["times"]) >= 1))
    except (KeyError, TypeError, ValueError):  # a malformed stored check covers nothing
        return False


def missing(gate_checks: list[dict[str, Any]], batch_checks: Any) -> list[dict[str, Any]]:
    """The gate's checks that none of the batch's checks covers (empty: the batch ran at least the gate's)."""
    ran = batch_checks if isinstance(batch_checks, list) and batch_checks else DEFAULT_CHECKS
    return [need for need in gate_checks if not any(_covers(have, need) for have in ran)]

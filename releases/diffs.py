"""A replayed run beside its recording, and the operator's checks over the pair (pure: no queries)."""

from __future__ import annotations

import difflib
from collections import Counter
from typing import Any

from releases.flow_replay import recorded_facts
from releases.recording import Recording
from releases.replay import Replayed

#: check name -> the parameter it takes (None: none)
#: The largest 'times' a check takes (NaN and infinity are no numbers a JSON column stores).
MAX_TIMES = 1e6

CHECKS: dict[str, str | None] = {
    "same_tools": None,
    "same_terminal_reason": None,
    "same_answer": None,
    "no_diff": None,
    "no_new_approvals": None,
    "answer_contains": "text",
    "answer_not_contains": "text",
    "cost_at_most": "times",
    "steps_at_most": "times",
}
DEFAULT_CHECKS: list[dict[str, Any]] = [{"check": "same_tools"}, {"check": "same_terminal_reason"}]
#: What must be equal for a replay to count as reproducing its recording (latency never is).
COMPARED = ("tools", "approvals", "terminal_reason", "answer", "steps", "tokens", "cost")


def check_errors(checks: Any) -> list[str]:
    """Problems with an operator's list of checks, each naming the entry and what is expected."""
    if not isinstance(checks, list):
        return [f"checks must be a list of objects like {{'check': 'same_tools'}}; got {type(checks).__name__}."]
    errors = []
    for i, entry in enumerate(checks):
        name = entry.get("check") if isinstance(entry, dict) else None
        if name not in CHECKS:
            errors.append(f"checks[{i}]: unknown check {name!r}; expected one of {', '.join(CHECKS)}.")
            continue
        param = CHECKS[name]
        value = entry.get(param) if param else None
        if param == "text" and (not isinstance(value, str) or not value):
            errors.append(f"checks[{i}] ({name}) needs a non-empty 'text'.")
        if param == "times" and (isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_TIMES):
            errors.append(f"checks[{i}] ({name}) needs 'times', a number > 0 and at most {MAX_TIMES:g} (1.5 = at most one and "
                          "a half times the recording).")
    return errors


def _pair(recorded: Any, replayed: Any) -> dict[str, Any]:
    return {"recorded": recorded, "replayed": replayed, "same": recorded == replayed}


def diff(recording: Recording, replayed: Replayed) -> dict[str, Any]:
    rec_usage, new_usage = recording.usage, replayed.usage
    tools, approvals, steps = recording.tools, recording.approvals, len(recording.responses.get("act", []))
    if recording.nodes:  # a flow run: its tool nodes' calls (parallel branches: sorted), its approvals, its nodes run
        tools, steps = recorded_facts(recording)
        approvals = sorted(recording.approvals)
    out: dict[str, Any] = {
        "tools": _pair(tools, replayed.tools),
        "approvals": _pair(approvals, replayed.approvals),
        "terminal_reason": _pair(recording.terminal_reason, replayed.terminal_reason),
        "answer": _pair(recording.output, replayed.output),
        # steps as model turns (a flow: nodes run): a recorded run that paused for an approval spent a step on its
        # resume, a replay does not
        "steps": _pair(steps, replayed.steps),
        "tokens": _pair(rec_usage.input_tokens + rec_usage.output_tokens, new_usage.input_tokens + new_usage.output_tokens),
        "cost": _pair(round(rec_usage.cost, 6), round(new_usage.cost, 6)),
        "latency_ms": {"recorded": recording.latency_ms, "replayed": replayed.latency_ms},
    }
    new = Counter(replayed.approvals) - Counter(approvals)
    out["approvals"]["new"] = sorted(new.elements())
    if not out["answer"]["same"]:
        out["answer"]["diff"] = list(difflib.unified_diff(recording.output.splitlines(), replayed.output.splitlines(),
                                                          "recorded", "replayed", lineterm="", n=2))[:200]
    if replayed.misses:
        out["misses"] = replayed.misses
    out["changed"] = [k for k in COMPARED if not out[k]["same"]]
    return out


def run_checks(checks: list[dict[str, Any]], d: dict[str, Any]) -> list[dict[str, Any]]:
    results = []
    answer = d["answer"]["replayed"] or ""
    for entry in checks or DEFAULT_CHECKS:
        name = entry["check"]
        ok: bool
        if name in ("same_tools", "same_terminal_reason", "same_answer"):
            ok = d[{"same_tools": "tools", "same_terminal_reason": "terminal_reason", "same_answer": "answer"}[name]]["same"]
        elif name == "no_diff":
            ok = not d["changed"]
        elif name == "no_new_approvals":
            ok = not d["approvals"]["new"]
        elif name == "answer_contains":
            ok = entry["text"] in answer
        elif name == "answer_not_contains":
            ok = entry["text"] not in answer
        else:  # cost_at_most, steps_at_most
            key = "cost" if name == "cost_at_most" else "steps"
            ok = d[key]["replayed"] <= float(entry["times"]) * d[key]["recorded"] + 1e-9
        results.append({**entry, "passed": bool(ok)})
    return results

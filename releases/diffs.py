"""A replayed run beside its recording, and the operator's checks over the pair (pure: no queries)."""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from audit.masking import MASK, mask_text, mask_value, normalize_key
from releases.flow_replay import recorded_facts
from releases.recording import Recording
from releases.replay import Replayed
from tools.arguments import canonical_json

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


# -- what a report shows ---------------------------------------------------------------------------------------------

#: A ``"key": value`` pair in JSON text that may be cut short (a miss quotes at most 200 characters of the arguments).
_PAIR = re.compile(r'"((?:[^"\\]|\\.){1,128})"\s*:\s*("(?:[^"\\]|\\.)*"?|[^,}\]]*)')


def masked_arguments(arguments: Any, sensitive_fields: Iterable[str]) -> Any:
    """A call's arguments (canonical JSON text) as the approval page shows them: the fields the tool declares sensitive,
    and secrets and personal data by name and pattern, masked (``audit.masking.mask_value``). Idempotent."""
    if not isinstance(arguments, str):
        return mask_value(arguments, sensitive_fields)
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return _masked_text(arguments, sensitive_fields)
    return canonical_json(mask_value(parsed, sensitive_fields))


def _masked_text(text: str, sensitive_fields: Iterable[str]) -> str:
    """Free text quoting arguments (a miss, arguments that are not JSON): declared fields' values in ``"key": value``
    pairs masked, then the patterns."""
    declared = {normalize_key(f) for f in sensitive_fields}
    if declared:
        text = _PAIR.sub(lambda m: f'"{m.group(1)}":"{MASK}"' if normalize_key(m.group(1)) in declared else m.group(0), text)
    return mask_text(text)


def masked(d: Any, sensitive: Mapping[str, Iterable[str]]) -> Any:
    """A result's diff as it is stored and shown, to every role: each tool call's recorded and replayed arguments masked
    as the approval page masks them (``sensitive``: a tool's name -> the fields it declares sensitive), the answers, the
    answer's text diff and the misses by the rule of the trace. Whether a side is ``same`` was decided on what ran;
    idempotent, so a diff stored masked is shown as it is."""
    if not isinstance(d, dict):
        return d
    out = dict(d)
    tools = out.get("tools")
    if isinstance(tools, dict):
        out["tools"] = {**tools, **{side: [_masked_call(c, sensitive) for c in tools[side]]
                                    for side in ("recorded", "replayed") if isinstance(tools.get(side), list)}}
    answer = out.get("answer")
    if isinstance(answer, dict):
        answer = {**answer, **{side: mask_text(answer[side]) for side in ("recorded", "replayed")
                               if isinstance(answer.get(side), str)}}
        if isinstance(answer.get("diff"), list):
            answer["diff"] = [mask_text(line) if isinstance(line, str) else line for line in answer["diff"]]
        out["answer"] = answer
    if isinstance(out.get("misses"), list):
        out["misses"] = [_masked_text(m, sensitive.get(m.split("(", 1)[0], ())) if isinstance(m, str) else m
                         for m in out["misses"]]
    return out


def _masked_call(call: Any, sensitive: Mapping[str, Iterable[str]]) -> Any:
    if not isinstance(call, dict) or "arguments" not in call:
        return call
    return {**call, "arguments": masked_arguments(call["arguments"], sensitive.get(str(call.get("tool")), ()))}


def tool_names(d: Any) -> set[str]:
    """The tools a diff names (its calls on both sides, and those its misses quote): whose declared fields it needs."""
    if not isinstance(d, dict):
        return set()
    tools = d.get("tools") if isinstance(d.get("tools"), dict) else {}
    names = {str(c.get("tool")) for side in ("recorded", "replayed") for c in tools.get(side) or [] if isinstance(c, dict)}
    names |= {m.split("(", 1)[0] for m in d.get("misses") or [] if isinstance(m, str) and "(" in m}
    return names

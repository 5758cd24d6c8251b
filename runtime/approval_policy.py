"""Approval policy documents: their checks, their normal form, and which of two is stricter.

A policy says when a tool call needs a person and how that person decides::

    {"mode": "always" | "never" | "condition",
     "conditions": [{"field": "amount", "op": ">", "value": 100}],   # or one "condition"; any met -> approval
     "expires_in_seconds": 3600,                                     # how long a request may wait for a decision
     "approver_roles": ["owner", "approver"],                        # who may decide
     "four_eyes": false,                                             # two different approvers
     "allow_edits": true}                                            # an approver may edit the arguments

A tool's own policy (what its plugin declares, or the tenant tool's row) is a floor: an agent
version may only make it stricter. "Looser", field by field:

- ``mode``: never < condition < always; and between two condition policies, every floor condition
  must be covered by a version condition that holds whenever it holds (same field, a threshold at
  least as low for ``>``/``>=``, at least as high for ``<``/``<=``, a superset for ``in``...);
- ``expires_in_seconds``: longer is looser (a stale request stays approvable longer);
- ``approver_roles``: a role the floor does not list is looser (more people may approve);
- ``four_eyes``: false when the floor says true is looser;
- ``allow_edits``: true when the floor says false is looser (an approver could change what runs).

An approver may edit a pending call's arguments before approving unless ``allow_edits`` is false
(the default is true: the approver may already let the call run as it stands, and an edit is
validated against the tool's schema and bound by a new hash). Pure Python (no Django), in the tools layer, so the tool
gateway, the tool service and the runtime's version checks all import it downward.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import model_validator

from runtime.documents import HERE, Document, Flag, Leaf, choice, integer, problem, problems, problems_of, text

DEFAULT_EXPIRY_SECONDS = 3600
MAX_EXPIRY_SECONDS = 30 * 86400
DEFAULT_APPROVER_ROLES = ("owner", "approver")
APPROVER_ROLES = ("owner", "operator", "approver")
#: The rest of the tenants' roles (``tenants.models.Role``): they may read a request, never decide it.
READ_ONLY_ROLES = ("viewer",)
OPERATORS = (">", ">=", "<", "<=", "==", "!=", "in", "not in")
MODES = ("never", "condition", "always")  # loosest first
#: The flag in an agent version's per-tool entry with which the tenant's owner loosens the tool's floor.
OVERRIDE_FLAG = "override_floor"


def _mode(value: Any) -> str:
    if value not in MODES:
        raise problem("must be always, never or condition", value)
    return str(value)


def _roles(value: Any) -> list[str]:
    """Who may decide: a non-empty list of roles that can (a viewer only reads; a name that is no role, or no role at
    all, makes a request no one but a platform administrator could decide)."""
    may = f"({', '.join(APPROVER_ROLES)})"
    if not isinstance(value, list):
        raise problem(f"must be a list of roles that may decide {may}", value[:64] if isinstance(value, str) else value)
    if not value:
        raise problems_of([f"{HERE}: must name at least one role that may decide {may}: with none, no one could decide "
                           "the request, got []"])
    name = f"name {', '.join(APPROVER_ROLES[:-1])} or {APPROVER_ROLES[-1]}"
    found = [f"{HERE}[{i}]: a {r} only reads and cannot decide; {name}, got {r!r}" if r in READ_ONLY_ROLES
             else f"{HERE}[{i}]: no such role; {name}, got {str(r)[:64]!r}" if isinstance(r, str)
             else f"{HERE}[{i}]: no such role; {name}, got {json.dumps(r, default=str)[:64]}"
             for i, r in enumerate(value) if r not in APPROVER_ROLES]
    if found:
        raise problems_of(found)
    return list(value)


#: An approval node's or a policy's ``approver_roles``, checked at save by :func:`_roles`.
ApproverRoles = Annotated[list[str], Leaf(_roles, {"type": "array", "minItems": 1, "items": {"enum": list(APPROVER_ROLES)}})]


class Condition(Document):
    """``{"field": "amount", "op": ">", "value": 100}``: holds when the call's argument compares so."""

    field: Annotated[str, text(nullable=False, example='"amount" (an argument of the tool)')]
    op: Annotated[str, choice(*OPERATORS)]
    value: Any


class ApprovalPolicy(Document):
    """A tool's approval policy (the floor) or an agent version's entry for one tool."""

    mode: Annotated[str, Leaf(_mode, {"type": "string", "enum": list(MODES)})] = "always"
    condition: Condition | None = None
    conditions: list[Condition] | None = None
    expires_in_seconds: Annotated[int, integer(10, maximum=MAX_EXPIRY_SECONDS)] = DEFAULT_EXPIRY_SECONDS
    approver_roles: ApproverRoles = list(DEFAULT_APPROVER_ROLES)
    four_eyes: Flag = False
    allow_edits: Flag = True

    @model_validator(mode="after")
    def _conditions_for_condition_mode(self) -> ApprovalPolicy:
        if self.mode == "condition" and not (self.conditions or self.condition):
            raise problem('required when mode is condition, e.g. {"field": "amount", "op": ">", "value": 100}', at=".condition")
        return self


class ApprovalOverride(ApprovalPolicy):
    """An agent version's entry (``policy.approvals.tools.<tool>``): with the owner's flag to loosen the floor."""

    override_floor: Flag = False


def policy_errors(policy: Any, *, path: str = "approval_policy", allow_override: bool = False) -> list[str]:
    """Readable problems with an approval policy document; empty when it is valid."""
    if policy in (None, {}):
        return []
    if not isinstance(policy, dict):
        return [f'{path}: must be an object, e.g. {{"mode": "always"}}']
    return problems(ApprovalOverride if allow_override else ApprovalPolicy, policy, path=path)[1]


def _well_formed(cond: Any) -> bool:
    return isinstance(cond, dict) and isinstance(cond.get("field"), str) and cond.get("op") in OPERATORS and "value" in cond


def normalise(policy: Mapping[str, Any] | None, *, requires_approval: bool = False) -> dict[str, Any]:
    """Every field filled in. Robust to a document that skipped validation: what cannot be read is read strictly."""
    policy = policy or {}
    mode = policy.get("mode") or ("always" if requires_approval else "never")
    raw = policy.get("conditions", [policy["condition"]] if policy.get("condition") else [])
    conditions = [dict(c) for c in (raw if isinstance(raw, list) else []) if _well_formed(c)]
    if mode not in MODES or (mode == "condition" and not conditions):
        mode = "always"  # unreadable: ask a person rather than guess
    expires = policy.get("expires_in_seconds")
    if not isinstance(expires, int) or isinstance(expires, bool) or not 10 <= expires <= MAX_EXPIRY_SECONDS:
        expires = DEFAULT_EXPIRY_SECONDS
    roles = policy.get("approver_roles")
    if not isinstance(roles, list) or not roles or any(r not in APPROVER_ROLES for r in roles):
        roles = list(DEFAULT_APPROVER_ROLES)
    return {
        "mode": mode,
        "conditions": conditions if mode == "condition" else [],
        "expires_in_seconds": expires,
        "approver_roles": list(dict.fromkeys(roles)),
        "four_eyes": policy.get("four_eyes") is True,
        "allow_edits": policy.get("allow_edits") is not False,
    }


def stricter(floor: Mapping[str, Any], policy: Mapping[str, Any]) -> dict[str, Any]:
    """The policy that needs approval whenever either does, with the stricter of each field (both normalised)."""
    edits = bool(floor.get("allow_edits", True) and policy.get("allow_edits", True))
    if floor["mode"] == "never":
        return {**policy, "allow_edits": edits}
    if policy["mode"] == "never":
        return {**floor, "allow_edits": edits}
    rank = max(MODES.index(floor["mode"]), MODES.index(policy["mode"]))
    conditions = [c for c in floor["conditions"]] + [c for c in policy["conditions"] if c not in floor["conditions"]]
    roles = [r for r in floor["approver_roles"] if r in policy["approver_roles"]] or list(floor["approver_roles"])
    return {
        "mode": MODES[rank],
        "conditions": conditions if MODES[rank] == "condition" else [],
        "expires_in_seconds": min(floor["expires_in_seconds"], policy["expires_in_seconds"]),
        "approver_roles": roles,
        "four_eyes": bool(floor["four_eyes"] or policy["four_eyes"]),
        "allow_edits": edits,
    }


def looser_fields(floor: Mapping[str, Any], policy: Mapping[str, Any], *, path: str) -> list[str]:
    """``path.field: how policy is looser than floor`` for every field where it is (both normalised)."""
    if floor["mode"] == "never":
        return []
    problems: list[str] = []
    if MODES.index(policy["mode"]) < MODES.index(floor["mode"]):
        problems.append(f'{path}.mode: "{policy["mode"]}" is looser than the tool\'s floor "{floor["mode"]}"')
    elif floor["mode"] == "condition" and policy["mode"] == "condition":
        for cond in floor["conditions"]:
            if not any(_implies(cond, mine) for mine in policy["conditions"]):
                problems.append(f"{path}.conditions: no condition covers the tool's floor condition {describe(cond)}, so calls the "
                                "floor sends to a person would run without one")
    if policy["mode"] == "never":
        return problems
    if policy["expires_in_seconds"] > floor["expires_in_seconds"]:
        problems.append(f"{path}.expires_in_seconds: {policy['expires_in_seconds']} is looser than the tool's floor "
                        f"{floor['expires_in_seconds']} (a request would stay approvable longer)")
    extra = [r for r in policy["approver_roles"] if r not in floor["approver_roles"]]
    if extra:
        problems.append(f"{path}.approver_roles: {policy['approver_roles']!r} lets {', '.join(extra)} approve, which the tool's "
                        f"floor {floor['approver_roles']!r} does not")
    if floor["four_eyes"] and not policy["four_eyes"]:
        problems.append(f"{path}.four_eyes: false is looser than the tool's floor true (two different approvers)")
    if not floor.get("allow_edits", True) and policy.get("allow_edits", True):
        problems.append(f"{path}.allow_edits: true is looser than the tool's floor false (approvers may not edit its arguments)")
    return problems


def describe(cond: Mapping[str, Any]) -> str:
    return f"{cond['field']} {cond['op']} {cond['value']}"


def number(value: Any) -> Decimal | None:
    if isinstance(value, bool):
        return None
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


def holds(cond: Mapping[str, Any], arguments: Mapping[str, Any]) -> bool:
    """Whether a condition is met by the arguments; a value that cannot be compared counts as met."""
    actual, op, expected = arguments.get(cond["field"]), cond["op"], cond["value"]
    if op in ("in", "not in"):
        inside = actual in (expected if isinstance(expected, list) else [expected])
        return inside if op == "in" else not inside
    a, b = number(actual), number(expected)
    if a is not None and b is not None:
        actual, expected = a, b
    try:
        return bool({  # every comparison is made: one that cannot be made means "ask a person"
            ">": actual > expected,
            ">=": actual >= expected,
            "<": actual < expected,
            "<=": actual <= expected,
            "==": actual == expected,
            "!=": actual != expected,
        }[op])
    except TypeError:
        return True  # not comparable (e.g. missing): ask a human rather than guess


def _values(cond: Mapping[str, Any]) -> list[Any]:
    value = cond["value"]
    return list(value) if isinstance(value, list) else [value]


def _same(a: Any, b: Any) -> bool:
    x, y = number(a), number(b)
    return x == y if x is not None and y is not None else bool(a == b)


def _implies(floor: Mapping[str, Any], mine: Mapping[str, Any]) -> bool:
    """Whenever ``floor`` holds, ``mine`` holds too (so ``mine`` asks a person at least as often)."""
    if floor["field"] != mine["field"]:
        return False
    op, value = floor["op"], floor["value"]
    if op in ("==", "in"):  # a finite set of values: each must meet mine
        return all(holds(mine, {floor["field"]: v}) for v in _values(floor))
    if op in ("!=", "not in"):  # everything but a set: mine must exclude no more than the floor does
        return mine["op"] in ("!=", "not in") and all(any(_same(m, f) for f in _values(floor)) for m in _values(mine))
    a, b = number(value), number(mine["value"])
    if a is None or b is None:
        return mine["op"] == op and _same(value, mine["value"])
    upward = (">", ">=")
    if op in upward and mine["op"] in upward:
        return b < a or (b == a and (mine["op"] == ">=" or op == ">"))
    downward = ("<", "<=")
    if op in downward and mine["op"] in downward:
        return b > a or (b == a and (mine["op"] == "<=" or op == "<"))
    return False


def strip_flag(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != OVERRIDE_FLAG}


def flagged(entry: Mapping[str, Any]) -> bool:
    return entry.get(OVERRIDE_FLAG) is True


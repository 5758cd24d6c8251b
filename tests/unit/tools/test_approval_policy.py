"""Which of two approval policies is looser, field by field, and the stricter of both (pure, no database)."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.approval_policy import looser_fields, normalise, policy_errors, stricter
from runtime.config import check_policy

ALWAYS = normalise({"mode": "always"})
OVER_100 = normalise({"mode": "condition", "condition": {"field": "amount", "op": ">", "value": 100}})


def _cond(op: str, value: Any, field: str = "amount") -> dict[str, Any]:
    return normalise({"mode": "condition", "condition": {"field": field, "op": op, "value": value}})


def _loose(floor: dict[str, Any], mine: dict[str, Any]) -> list[str]:
    return [p.split(":", 1)[0] for p in looser_fields(floor, mine, path="p")]


@pytest.mark.parametrize(("mine", "fields"), [
    ({"mode": "never"}, ["p.mode"]),
    ({"mode": "condition", "condition": {"field": "amount", "op": ">", "value": 1}}, ["p.mode"]),
    ({"mode": "always", "expires_in_seconds": 7200}, ["p.expires_in_seconds"]),
    ({"mode": "always", "approver_roles": ["operator"]}, ["p.approver_roles"]),
    ({"mode": "always", "expires_in_seconds": 60, "approver_roles": ["approver"], "four_eyes": True}, []),
])
def test_looser_than_always(mine: dict[str, Any], fields: list[str]) -> None:
    assert _loose(ALWAYS, normalise(mine)) == fields


def test_four_eyes_cannot_be_dropped() -> None:
    assert _loose(normalise({"mode": "always", "four_eyes": True}), ALWAYS) == ["p.four_eyes"]


@pytest.mark.parametrize(("mine", "looser"), [
    (_cond(">", 100), False),
    (_cond(">=", 100), False),
    (_cond(">", 50), False),
    (_cond(">", "99.5"), False),
    (_cond(">", 101), True),
    (_cond("<", 100), True),
    (_cond(">", 100, field="total"), True),
    (ALWAYS, False),
    (normalise({"mode": "never"}), True),
])
def test_a_condition_must_ask_at_least_whenever_the_floor_asks(mine: dict[str, Any], looser: bool) -> None:
    assert bool(_loose(OVER_100, mine)) is looser


def test_set_conditions_and_thresholds_downward() -> None:
    assert not _loose(_cond("in", ["DE", "FR"], "country"), _cond("in", ["DE", "FR", "IT"], "country"))
    assert _loose(_cond("in", ["DE", "FR"], "country"), _cond("==", "DE", "country"))
    assert not _loose(_cond("==", 500), _cond(">=", 100))
    assert not _loose(_cond("<", 10), _cond("<=", 10))
    assert _loose(_cond("<=", 10), _cond("<", 10))


def test_a_floor_that_never_asks_allows_anything() -> None:
    assert _loose(normalise({}), normalise({"mode": "never"})) == []
    assert _loose(normalise({}), normalise({"mode": "always", "approver_roles": ["operator"]})) == []


def test_the_stricter_of_two_policies() -> None:
    floor = normalise({"mode": "condition", "condition": {"field": "amount", "op": ">", "value": 100},
                       "expires_in_seconds": 600, "approver_roles": ["owner", "approver"]})
    mine = normalise({"mode": "never", "four_eyes": True})
    assert stricter(floor, mine) == floor, "a version that says never keeps the floor"
    both = stricter(floor, normalise({"mode": "condition", "condition": {"field": "country", "op": "==", "value": "DE"},
                                      "expires_in_seconds": 7200, "approver_roles": ["operator", "approver"], "four_eyes": True}))
    assert both["mode"] == "condition" and len(both["conditions"]) == 2
    assert (both["expires_in_seconds"], both["approver_roles"], both["four_eyes"]) == (600, ["approver"], True)
    assert stricter(normalise({}), mine) == mine


def test_an_unreadable_policy_is_read_strictly() -> None:
    assert normalise({"mode": "sometimes"})["mode"] == "always"
    assert normalise({"mode": "condition", "condition": "amount > 5"})["mode"] == "always"
    assert normalise({}, requires_approval=True)["mode"] == "always"


def test_version_entries_are_checked_and_only_they_take_the_override_flag() -> None:
    assert policy_errors({"mode": "never", "override_floor": True}) == [
        "approval_policy.override_floor: unknown field; expected one of ['allow_edits', 'approver_roles', 'condition', "
        "'conditions', 'expires_in_seconds', 'four_eyes', 'mode']"]
    assert policy_errors({"mode": "never", "override_floor": True}, allow_override=True) == []
    errors = check_policy({"approvals": {"tools": {"refund_order": {"mode": "sometimes", "override_floor": "yes"}}}})
    assert any(e.startswith("approvals.tools.refund_order.mode: must be always, never or condition") for e in errors)
    assert any(e.startswith("approvals.tools.refund_order.override_floor: must be true or false") for e in errors)


def test_every_problem_of_a_policy_is_named_by_its_path() -> None:
    errors = policy_errors({"mode": "condition", "conditions": [{"field": "amount", "op": "~", "value": 1}, {"op": ">"}],
                            "expires_in_seconds": 5, "approver_roles": ["root"], "four_eyes": "yes"})
    assert errors == [
        "approval_policy.conditions[0].op: must be one of ['>', '>=', '<', '<=', '==', '!=', 'in', 'not in'], got '~'",
        "approval_policy.conditions[1].field: is required",
        "approval_policy.conditions[1].value: is required",
        "approval_policy.expires_in_seconds: must be an integer from 10 to 2592000, got 5",
        "approval_policy.approver_roles[0]: no such role; name owner, operator or approver, got 'root'",
        "approval_policy.four_eyes: must be true or false, got 'yes'",
    ]
    assert policy_errors({"mode": "condition"}) == [
        'approval_policy.condition: required when mode is condition, e.g. {"field": "amount", "op": ">", "value": 100}']
    assert policy_errors(["always"]) == ['approval_policy: must be an object, e.g. {"mode": "always"}']


def test_allow_edits_defaults_to_true_and_only_the_floor_can_forbid_what_a_version_cannot_allow_again() -> None:
    assert normalise({})["allow_edits"] is True and normalise({"allow_edits": False})["allow_edits"] is False
    assert policy_errors({"mode": "always", "allow_edits": "no"}) == ["approval_policy.allow_edits: must be true or false, got 'no'"]
    floor = normalise({"mode": "always", "allow_edits": False})
    assert _loose(floor, normalise({"mode": "always"})) == ["p.allow_edits"]
    assert _loose(normalise({"mode": "always"}), normalise({"mode": "always", "allow_edits": False})) == []
    assert stricter(floor, normalise({"mode": "always"}))["allow_edits"] is False
    assert stricter(normalise({}), normalise({"mode": "always", "allow_edits": False}))["allow_edits"] is False

"""Approve with edits: an approver changes a pending call's arguments before approving it.

The changes are merged over the call's arguments and validated against the tool's parameter schema
(the same parser the tool gateway uses); the result is canonical and bound by its own hash. The gate
runs the call with exactly these arguments, and only when every approval was given for that hash.
The model is told what changed (``model_note``); sensitive fields are masked in every rendering.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from approvals.models import ApprovalRequest
from approvals.policy import floor_for, rule_for, version_policy
from audit.masking import mask_value
from core.errors import Invalid
from tools.arguments import arguments_hash, parse_arguments


class EditInvalid(Invalid):
    """Edited arguments that do not fit the tool's schema: every problem, each naming its field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("The edited arguments are not valid: " + "; ".join(problems), field="arguments", code="invalid_arguments")

    def details(self) -> Any:
        return self.problems


@dataclass(frozen=True)
class Edit:
    arguments: dict[str, Any]
    hash: str
    changes: list[dict[str, Any]]
    four_eyes: bool


def _version_entry(request: ApprovalRequest) -> dict[str, Any] | None:
    version = getattr(request.run, "version", None)
    policy = getattr(version, "policy", None) or {}
    tools = (policy.get("approvals") or {}).get("tools") if isinstance(policy.get("approvals"), dict) else None
    entry = tools.get(request.tool_name) if isinstance(tools, dict) else None
    return entry if isinstance(entry, dict) else None


def edits_allowed(request: ApprovalRequest) -> bool:
    """Whether the tool's policy lets an approver edit its arguments: the floor (the tool's row and its plugin's
    declaration) and the agent version's entry must both allow it. A version entry can forbid edits, never allow
    what the floor forbids (an owner's ``override_floor`` does not loosen this field)."""
    tool = request.tool
    if tool is None:
        return False
    if not floor_for(tool)["allow_edits"]:
        return False
    entry = _version_entry(request)
    return entry is None or bool(version_policy(tool, entry)["allow_edits"])


def change_list(sensitive: Any, before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """``[{"field", "old", "new"}]`` for every top-level field that differs, masked like everything else."""
    fields = sorted(set(before) | set(after))
    masked_before = mask_value(before, sensitive or ())
    masked_after = mask_value(after, sensitive or ())
    return [
        {"field": key, "old": masked_before.get(key), "new": masked_after.get(key)}
        for key in fields
        if before.get(key) != after.get(key)
    ]


def _show(value: Any) -> str:
    return "(not set)" if value is None else repr(value) if not isinstance(value, str) else f'"{value}"'


def model_note(tool_name: str, changes: list[dict[str, Any]]) -> str:
    """What the model reads before the tool's result when an approver edited the call."""
    listed = "; ".join(f"{c['field']}: {_show(c['old'])} → {_show(c['new'])}" for c in changes)
    return (
        f"Note: the approver edited the arguments of this {tool_name} call before approving it, and it ran with the "
        f"edited arguments ({listed}). Tell the user what was actually done, with the edited values, not what you asked for."
    )


def prepare(request: ApprovalRequest, changes: Any) -> Edit | None:
    """Validate the approver's ``changes`` (fields to change, merged over the call's arguments). None: nothing changed."""
    if not isinstance(changes, dict):
        raise EditInvalid(['arguments: must be an object of the fields to change, e.g. {"amount": "30.00"}'])
    tool = request.tool
    assert tool is not None
    parsed = parse_arguments({**request.arguments, **changes}, tool.parameters or {"type": "object", "properties": {}},
                             tool_name=tool.name)
    if not parsed.ok:
        raise EditInvalid([f"arguments.{p.field}: expected {p.expected}, got {p.received}" for p in parsed.errors])
    edited = parsed.arguments
    new_hash = arguments_hash(edited)
    if new_hash == request.arguments_hash:
        return None
    rule = rule_for(tool, edited, _version_entry(request))
    return Edit(edited, new_hash, change_list(tool.sensitive_fields, request.arguments, edited), rule.four_eyes)


def audit_details(request: ApprovalRequest) -> dict[str, Any]:
    """Both versions for the audit row, masked (empty when nobody edited the call)."""
    if request.edited_arguments is None:
        return {}
    sensitive = request.tool.sensitive_fields if request.tool is not None else ()
    return {
        "edited": True,
        "original_arguments": mask_value(request.arguments, sensitive or ()),
        "original_hash": request.arguments_hash,
        "edited_arguments": mask_value(request.edited_arguments, sensitive or ()),
        "edited_hash": request.edited_hash,
        "changes": change_list(sensitive, request.arguments, request.edited_arguments),
    }

"""config/compiled.py ``new_with_defaults``: what ``Model(**values)`` makes, without ``Model.__init__``.

A tool call's audit row is made this way (tools/gateway.py ``_row``), once per call. It must be the constructor's
object: the values given, every other field at its default evaluated for this object (a fresh list, the time now),
a new unsaved instance; with an init receiver listening, or a name the model does not have, the constructor makes it.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import signals
from django.utils import timezone

from audit.models import ToolCallAudit
from config.compiled import new_with_defaults

VALUES = {"tenant_id": 3, "run_id": None, "call_id": "c1", "tool_name": "lookup", "status": "ok", "latency_ms": 7,
          "arguments_summary": '{"q": "x"}', "attempt_call_ids": ["c1"]}


def _fields(row: ToolCallAudit) -> dict[str, Any]:
    return {f.attname: getattr(row, f.attname) for f in ToolCallAudit._meta.concrete_fields if f.attname != "created_at"}


def test_it_is_what_the_constructor_makes() -> None:
    before = timezone.now()
    made = new_with_defaults(ToolCallAudit, dict(VALUES))
    assert isinstance(made, ToolCallAudit)
    assert _fields(made) == _fields(ToolCallAudit(**VALUES))
    assert made.step == 0 and made.error == "" and made.chain_seq is None and made.pk is None  # defaults
    assert before <= made.created_at <= timezone.now()  # the callable default, evaluated now
    assert (made._state.adding, made._state.db) == (True, None)


def test_a_default_that_is_a_new_object_is_new_for_each_row() -> None:
    values = {k: v for k, v in VALUES.items() if k != "attempt_call_ids"}
    first, second = new_with_defaults(ToolCallAudit, values), new_with_defaults(ToolCallAudit, values)
    assert first.attempt_call_ids == [] and first.attempt_call_ids is not second.attempt_call_ids


def test_with_a_receiver_listening_the_constructor_makes_it() -> None:
    seen: list[Any] = []

    def receiver(sender: Any, instance: Any, **_: Any) -> None:
        seen.append(instance)

    signals.post_init.connect(receiver, sender=ToolCallAudit)
    try:
        made = new_with_defaults(ToolCallAudit, dict(VALUES))
    finally:
        signals.post_init.disconnect(receiver, sender=ToolCallAudit)
    assert seen == [made]


def test_a_name_the_model_does_not_have_is_refused_as_the_constructor_refuses_it() -> None:
    with pytest.raises(TypeError, match="unexpected keyword"):
        new_with_defaults(ToolCallAudit, {**VALUES, "no_such_field": 1})

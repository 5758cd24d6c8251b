"""Tool kinds: one module each, one table, and the table and the column's choices name the same kinds."""

from __future__ import annotations

from tools.executors import ToolFailure
from tools.kinds import KINDS, executor_for, kind_for
from tools.models import ToolKind


def test_every_kind_of_the_column_has_its_module_in_the_table_and_no_other() -> None:
    assert set(KINDS) == set(ToolKind.values)
    for name, kind in KINDS.items():
        assert kind.name == name and callable(kind.execute) and callable(kind.check)
        assert kind.__class__.__module__ == "tools.kinds.base"


def test_an_unknown_kind_is_a_failure_the_model_reads() -> None:
    assert kind_for("carrier-pigeon") is None
    try:
        executor_for("carrier-pigeon")
    except ToolFailure as exc:
        assert exc.status == "error" and "carrier-pigeon" in str(exc)
    else:
        raise AssertionError("an unknown kind must not be executable")


def test_each_kinds_own_checks_run_through_the_table() -> None:
    problems: list[tuple[str, str]] = []
    KINDS["http"].check({"method": "FETCH", "url": "https://api.example.com/o/{order}"}, {"properties": {}}, None,
                        lambda key, message: problems.append((key, message)))
    assert ("method", "must be one of GET, POST, PUT, PATCH, DELETE; got 'FETCH'") in problems
    assert any(key == "url" and "{order}" in message for key, message in problems)
    assert KINDS["agent"].default_parameters is not None and KINDS["mcp"].default_timeout == 30.0

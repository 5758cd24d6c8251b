"""Each way of tampering with the audit is caught, on both chains: tool-call rows and configuration changes.

Whoever can write the database but does not hold AUDIT_HMAC_KEY can edit a row and recompute its hash (plain
SHA-256 or an HMAC under a guessed key), delete a row in the middle, or delete the newest rows and lower the head
to match; the last is caught against an exported record of the heads, kept elsewhere.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from audit import chain
from audit.models import AuditChainHead, ConfigChainHead, ConfigChange, ToolCallAudit
from audit.services import record_change
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    world = make_world()
    with transaction.atomic():
        chain.write_sealed([SimpleNamespace(row=ToolCallAudit(tenant=world.tenant, call_id=f"c{i}", tool_name="query_order",
                                                                status="ok", arguments_summary=f'{{"order_id": "O20241128000{i}"}}'),
                                            started_pk=None) for i in range(1, 6)], world.tenant.pk)
    for i in range(1, 6):
        record_change(tenant=world.tenant, actor=world.operator, action="tool.updated", target=world.agent,
                      details={"changed": ["description"], "n": i})
    return world


def _rows(world: World, table: str) -> list[Any]:
    if table == "tools":
        return list(ToolCallAudit.objects.filter(tenant=world.tenant).order_by("chain_seq"))
    return list(ConfigChange.objects.filter(tenant=world.tenant).order_by("chain_seq"))


def _model(table: str) -> Any:
    return ToolCallAudit if table == "tools" else ConfigChange


def _verify(world: World, capsys: Any, against: Path | None = None) -> str:
    with pytest.raises(CommandError):
        call_command("verify_audit", tenant=world.tenant.slug, against=str(against) if against else None)
    return str(capsys.readouterr().out)


def test_an_untouched_audit_verifies_and_exports_its_heads(world: World, tmp_path: Path, capsys: Any) -> None:
    heads = tmp_path / "heads.json"
    call_command("verify_audit", export_heads=str(heads))
    out = capsys.readouterr().out
    assert f"{world.tenant.slug} tool calls: OK, 5 rows" in out and f"{world.tenant.slug} config changes: OK" in out
    record = json.loads(heads.read_text())
    assert record["chains"][f"tools:{world.tenant.pk}"]["seq"] == 5 and record["signature"]
    call_command("verify_audit", against=str(heads))
    assert "every exported head is still in place" in capsys.readouterr().out


@pytest.mark.parametrize("table", ["tools", "config"])
def test_an_edited_middle_row_is_caught(world: World, capsys: Any, table: str) -> None:
    middle = _rows(world, table)[2]
    field = {"tools": {"status": "error"}, "config": {"action": "agent.deleted"}}[table]
    _model(table).objects.filter(pk=middle.pk).update(**field)
    assert f"BROKEN at audit row {middle.pk}" in _verify(world, capsys)


@pytest.mark.parametrize("table", ["tools", "config"])
@pytest.mark.parametrize("rehash", ["sha256", "wrong-key hmac"])
def test_an_edit_rehashed_without_the_key_is_caught(world: World, capsys: Any, table: str, rehash: str) -> None:
    rows = _rows(world, table)
    middle = rows[2]
    if table == "tools":
        middle.status = "error"
    else:
        middle.details = {"changed": ["approval_policy"]}
    # the attacker recomputes the edited row's hash and every later link, the way the code does, but without the key
    payload = (chain.HASHED_FIELDS if table == "tools" else chain.CHANGE_FIELDS)
    prev = middle.prev_hash
    for row in rows[2:]:
        row.prev_hash = prev
        data = {name: str(getattr(row, name)) for name in payload}
        blob = json.dumps(data, sort_keys=True).encode()
        row.row_hash = (hashlib.sha256(blob).hexdigest() if rehash == "sha256"
                        else hmac.new(b"guessed-key", blob, hashlib.sha256).hexdigest())
        fields = {"prev_hash": row.prev_hash, "row_hash": row.row_hash}
        fields.update({"status": row.status} if table == "tools" else {"details": row.details})
        _model(table).objects.filter(pk=row.pk).update(**fields)
        prev = row.row_hash
    if table == "tools":
        AuditChainHead.objects.filter(tenant=world.tenant).update(hash=prev)
    else:
        ConfigChainHead.objects.filter(chain=f"tenant:{world.tenant.pk}").update(hash=prev)
    assert f"BROKEN at audit row {middle.pk}" in _verify(world, capsys)


@pytest.mark.parametrize("table", ["tools", "config"])
def test_a_deleted_middle_row_is_caught(world: World, capsys: Any, table: str) -> None:
    rows = _rows(world, table)
    _model(table).objects.filter(pk=rows[2].pk)._raw_delete(_model(table).objects.db)
    out = _verify(world, capsys)
    assert "chain_seq 3" in out and "missing (deleted?)" in out


@pytest.mark.parametrize("table", ["tools", "config"])
def test_a_deleted_tail_with_the_head_lowered_is_caught_against_an_exported_record(
    world: World, tmp_path: Path, capsys: Any, table: str
) -> None:
    heads = tmp_path / "heads.json"
    call_command("verify_audit", export_heads=str(heads))
    capsys.readouterr()
    rows = _rows(world, table)
    # delete the two newest rows and lower the head to the row before them: the chain itself looks whole
    _model(table).objects.filter(pk__in=[r.pk for r in rows[3:]])._raw_delete(_model(table).objects.db)
    if table == "tools":
        AuditChainHead.objects.filter(tenant=world.tenant).update(seq=3, hash=rows[2].row_hash)
    else:
        ConfigChainHead.objects.filter(chain=f"tenant:{world.tenant.pk}").update(seq=3, hash=rows[2].row_hash)
    call_command("verify_audit", tenant=world.tenant.slug)  # without the record, nothing shows
    out = _verify(world, capsys, against=heads)
    assert f"row {len(rows)} of the exported head is gone" in out


def test_a_tampered_export_is_caught(world: World, tmp_path: Path, capsys: Any) -> None:
    heads = tmp_path / "heads.json"
    call_command("verify_audit", export_heads=str(heads))
    capsys.readouterr()
    record = json.loads(heads.read_text())
    record["chains"][f"tools:{world.tenant.pk}"]["seq"] = 2  # an attacker lowers the exported head too
    heads.write_text(json.dumps(record))
    assert "signature does not match" in _verify(world, capsys, against=heads)


def test_a_change_written_around_the_service_is_caught(world: World, capsys: Any) -> None:
    ConfigChange.objects.bulk_create([ConfigChange(tenant=world.tenant, action="tool.updated", details={})])
    assert "in no chain" in _verify(world, capsys)

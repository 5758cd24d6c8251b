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
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from audit import chain
from audit.models import AuditChainHead, ConfigChainHead, ConfigChange, ToolCallAudit
from audit.services import record_change
from config.env import env_key
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
    tools = record["chains"][f"tools:{world.tenant.pk}"]
    head_row = ToolCallAudit.objects.get(tenant=world.tenant, chain_seq=5)
    assert tools["seq"] == tools["rows"] == 5 and tools["row_id"] == head_row.pk and tools["hash"] == head_row.row_hash
    assert record["chains"][f"config:tenant:{world.tenant.pk}"]["rows"] == len(_rows(world, "config"))
    assert record["exported_at"] and record["signature"]
    call_command("verify_audit", against=str(heads))
    assert "every exported head is still in place" in capsys.readouterr().out


@pytest.mark.parametrize("table", ["tools", "config"])
def test_an_edited_middle_row_is_caught(world: World, capsys: Any, table: str) -> None:
    middle = _rows(world, table)[2]
    field = {"tools": {"status": "error"}, "config": {"action": "agent.deleted"}}[table]
    _model(table).objects.filter(pk=middle.pk).update(**field)
    assert f"BROKEN at audit row {middle.pk}" in _verify(world, capsys)


def _plain_sha256(label: str, data: dict[str, Any]) -> str:
    """What an attacker computes without the key: the code's exact payload, hashed with no key at all."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def _wrong_key_hmac(label: str, data: dict[str, Any]) -> str:
    """... or the code's exact payload under a guessed key."""
    payload = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hmac.new(b"guessed-key-guessed-key-guessed-key", payload, hashlib.sha256).hexdigest()


def _edit_and_rehash(world: World, table: str, monkeypatch: pytest.MonkeyPatch, mac: Any) -> Any:
    """Edit the middle row, then recompute its hash and every later link and the head, the way the code does, with ``mac``."""
    rows = _rows(world, table)
    middle = rows[2]
    if table == "tools":
        middle.status = "error"
    else:
        middle.details = {"changed": ["approval_policy"]}
    prev = middle.prev_hash
    with monkeypatch.context() as m:
        if mac is not None:
            m.setattr(chain, "_mac", mac)
        for row in rows[2:]:
            row.prev_hash = prev
            row.row_hash = chain.digest(row) if table == "tools" else chain.change_digest(row)
            fields = {"prev_hash": row.prev_hash, "row_hash": row.row_hash}
            fields.update({"status": row.status} if table == "tools" else {"details": row.details})
            _model(table).objects.filter(pk=row.pk).update(**fields)
            prev = row.row_hash
    if table == "tools":
        AuditChainHead.objects.filter(tenant=world.tenant).update(hash=prev)
    else:
        ConfigChainHead.objects.filter(chain=f"tenant:{world.tenant.pk}").update(hash=prev)
    return middle


@pytest.mark.parametrize("table", ["tools", "config"])
@pytest.mark.parametrize("mac", [_plain_sha256, _wrong_key_hmac], ids=["sha256", "wrong-key-hmac"])
def test_an_edit_rehashed_without_the_key_is_caught(world: World, capsys: Any, monkeypatch: pytest.MonkeyPatch, table: str,
                                                    mac: Any) -> None:
    middle = _edit_and_rehash(world, table, monkeypatch, mac)
    out = _verify(world, capsys)
    assert f"BROKEN at audit row {middle.pk} (chain_seq 3)" in out and "keyed hash" in out


@pytest.mark.parametrize("table", ["tools", "config"])
def test_only_the_key_stands_between_an_edit_and_a_clean_chain(world: World, capsys: Any, monkeypatch: pytest.MonkeyPatch,
                                                               table: str) -> None:
    """The control for the test above: the same rewrite with the key passes, so what catches it there is the key alone."""
    _edit_and_rehash(world, table, monkeypatch, None)
    call_command("verify_audit", tenant=world.tenant.slug)
    assert "BROKEN" not in capsys.readouterr().out


def test_the_key_comes_from_audit_hmac_key(world: World, capsys: Any, settings: Any) -> None:
    call_command("verify_audit", tenant=world.tenant.slug)
    capsys.readouterr()
    settings.AUDIT_HMAC_KEY = "another-audit-key-0123456789abcdefghijklmnop"
    out = _verify(world, capsys)
    assert f"{world.tenant.slug} tool calls: BROKEN" in out and f"{world.tenant.slug} config changes: BROKEN" in out


def test_a_short_audit_hmac_key_stops_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDIT_HMAC_KEY", "too-short")
    with pytest.raises(ImproperlyConfigured, match="AUDIT_HMAC_KEY must be at least 32 characters"):
        env_key("AUDIT_HMAC_KEY")
    monkeypatch.setenv("AUDIT_HMAC_KEY", "k" * 32)
    assert env_key("AUDIT_HMAC_KEY") == "k" * 32
    monkeypatch.delenv("AUDIT_HMAC_KEY")
    assert env_key("AUDIT_HMAC_KEY") == ""


@pytest.mark.parametrize("table", ["tools", "config"])
def test_a_deleted_middle_row_is_caught(world: World, tmp_path: Path, capsys: Any, table: str) -> None:
    heads = tmp_path / "heads.json"
    call_command("verify_audit", export_heads=str(heads))
    rows = _rows(world, table)
    _model(table).objects.filter(pk=rows[2].pk)._raw_delete(_model(table).objects.db)
    out = _verify(world, capsys, against=heads)
    assert f"BROKEN at audit row {rows[3].pk} (chain_seq 3): row with chain_seq 3 is missing (deleted?)" in out
    assert f"{len(rows) - 1} rows where the exported record had {len(rows)} (rows deleted)" in out


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
    assert f"row {len(rows)} (audit row {rows[-1].pk}) of the exported head is gone" in out


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

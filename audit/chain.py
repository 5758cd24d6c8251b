"""Keyed hash chains over the audit: tool-call rows (per tenant) and configuration changes (per tenant, and platform).

When a tool-call row reaches its final status it is sealed: it gets the tenant's next ``chain_seq``, the
previous row's hash, and its own HMAC-SHA256 over its content and that link. A configuration change is
chained the moment it is written. The key (``settings.AUDIT_HMAC_KEY``, by default derived from
``SECRET_KEY``) never enters the database, so whoever can write the database but not read the key can
neither edit a row and recompute its hash nor forge a new chain. Deleting the newest rows and lowering the
head is caught against an exported record of the heads (``export_heads`` / ``check_against``), kept where
the database's writers cannot reach.

Lock order, everywhere (issue #50): a run's row, then its tenant's row, then the tenant's audit chain head (a
session's row after those). The tenant's row is locked ``FOR NO KEY UPDATE``, never ``FOR UPDATE``: that lock still
excludes another of its kind (a flow's tenant-wide node bound is decided under it), but it does not conflict with the
``FOR KEY SHARE`` that PostgreSQL's foreign-key check of a new row referencing the tenant takes, at commit (Django's
constraints are deferred). A step holding the chain head checks its audit rows' keys to the tenant when it commits; a
``FOR UPDATE`` on the tenant taken before the head made the two wait for each other. A deadlock or serialization
failure left anyway is retried by the step or completion that lost it (``core/conflicts.py``).

A tool-call row's digest covers ``HASHED_FIELDS`` and its time, and, when the row has any,
``attempt_call_ids`` (every id the model gave the call; a crash-resumed write has two or more). Rows
written before that field existed hold an empty list and are hashed exactly as they were (the key is
left out of the payload), so their stored hashes still verify; every row written since holds at least
one id, so emptying, editing or adding ids changes its payload and breaks the chain there.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.models import AuditChainHead, ConfigChainHead, ConfigChange, ToolCallAudit
from core.batch import WriteBatch

HASHED_FIELDS = (
    "tenant_id",
    "run_id",
    "agent_id",
    "version_id",
    "session_id",
    "user_id",
    "api_key_id",
    "step",
    "call_id",
    "span_id",
    "tool_name",
    "arguments_summary",
    "arguments_hash",
    "status",
    "error",
    "latency_ms",
    "result_size",
    "idempotency_key",
    "chain_seq",
    "prev_hash",
)
CHANGE_FIELDS = ("tenant_id", "actor_id", "action", "target_type", "target_id", "target_repr", "chain", "chain_seq", "prev_hash")


def _key(label: str) -> bytes:
    """The HMAC key for one use (``label``): derived from AUDIT_HMAC_KEY, or from SECRET_KEY when that is unset."""
    return _derive(settings.AUDIT_HMAC_KEY or settings.SECRET_KEY, label)


@cache
def _derive(material: str, label: str) -> bytes:
    return hmac.new(material.encode(), f"agentops audit {label} v1".encode(), hashlib.sha256).digest()


def _mac(label: str, data: dict[str, Any]) -> str:
    payload = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hmac.new(_key(label), payload, hashlib.sha256).hexdigest()


def digest(row: ToolCallAudit) -> str:
    data: dict[str, Any] = {name: getattr(row, name) for name in HASHED_FIELDS}
    data["run_id"] = str(data["run_id"]) if data["run_id"] is not None else None
    data["session_id"] = str(data["session_id"]) if data["session_id"] is not None else None
    data["created_at"] = row.created_at.isoformat(timespec="microseconds")
    attempts = getattr(row, "attempt_call_ids", None)  # absent on the historical model of migration 0004
    if attempts:  # empty on rows sealed before the field existed: their payload (and hash) stays as it was
        data["attempt_call_ids"] = list(attempts)
    return _mac("tool-call chain", data)


def change_digest(row: ConfigChange) -> str:
    data: dict[str, Any] = {name: getattr(row, name) for name in CHANGE_FIELDS}
    data["details"] = row.details
    data["created_at"] = row.created_at.isoformat(timespec="microseconds")
    return _mac("config chain", data)


def lock_head(tenant_id: int) -> AuditChainHead:
    """The tenant's tool-call chain head, locked until the transaction ends; created on the tenant's first row.

    One statement once the head exists (every row but a tenant's first).
    """
    head = AuditChainHead.objects.select_for_update().filter(tenant_id=tenant_id).first()
    if head is None:
        AuditChainHead.objects.bulk_create([AuditChainHead(tenant_id=tenant_id)], ignore_conflicts=True)
        head = AuditChainHead.objects.select_for_update().get(tenant_id=tenant_id)
    return head


def write_sealed(writes: list[Any], tenant_id: int, batch: WriteBatch | None = None, head: AuditChainHead | None = None) -> None:
    """Seal and write a step's audit rows. Call inside the step's transaction.

    ``writes`` are gateway AuditWrite items: a new row, or the completion of a ``started`` row. The chain
    head is locked (and read) here, in one statement; the sealed rows are computed in Python and their
    writes (rows, completed ``started`` rows, the head) go into ``batch`` when given, the step's other
    writes' single statement (core/batch.py), else are sent here. ``head``: the head as the caller already
    read it under a lock held by this transaction (the run store locks it with the run row), else it is locked here.
    """
    own = batch is None
    out = WriteBatch() if batch is None else batch
    if head is None:
        head = lock_head(tenant_id)
    new_rows: list[ToolCallAudit] = []
    for write in writes:
        row: ToolCallAudit = write.row
        head.seq += 1
        row.chain_seq = head.seq
        row.prev_hash = head.hash
        row.row_hash = digest(row)
        head.hash = row.row_hash
        if write.started_pk is None:
            new_rows.append(row)
        else:
            fields = {
                name: getattr(row, name)
                for name in (
                    "call_id",  # the resumed attempt's id: the one the committed message log carries
                    "attempt_call_ids",
                    "status",
                    "error",
                    "latency_ms",
                    "result_size",
                    "arguments_summary",
                    "arguments_hash",  # what was sealed is what is stored, whatever the resumed attempt saw
                    "step",
                    "chain_seq",
                    "prev_hash",
                    "row_hash",
                    "span_id",
                )
            }
            out.update_where(ToolCallAudit, {"id": write.started_pk}, **fields)
    out.insert(ToolCallAudit, new_rows)
    out.update_where(AuditChainHead, {"tenant_id": tenant_id}, seq=head.seq, hash=head.hash)
    if own:
        out.execute()


def change_chain(tenant_id: int | None) -> str:
    return f"tenant:{tenant_id}" if tenant_id is not None else "platform"


def append_change(row: ConfigChange) -> ConfigChange:
    """Chain and write a new configuration change (in the caller's transaction, or its own)."""
    row.created_at = timezone.now()
    row.details = json.loads(json.dumps(row.details or {}, default=str))  # hash exactly what the JSON column will hold
    row.chain = change_chain(row.tenant_id)
    with transaction.atomic():
        ConfigChainHead.objects.bulk_create([ConfigChainHead(chain=row.chain)], ignore_conflicts=True)
        head = ConfigChainHead.objects.select_for_update().get(chain=row.chain)
        head.seq += 1
        row.chain_seq, row.prev_hash = head.seq, head.hash
        row.row_hash = change_digest(row)
        head.hash = row.row_hash
        row.save()
        head.save(update_fields=["seq", "hash"])
    return row


@dataclass(frozen=True)
class Break:
    chain: str
    row_id: int | None
    chain_seq: int
    reason: str


def _walk(chain: str, rows: Iterable[Any], hasher: Any, head_seq: int | None) -> tuple[int, str, Break | None]:
    expected_prev = ""
    expected_seq = 1
    checked = 0
    for row in rows:
        if row.chain_seq != expected_seq:
            return checked, expected_prev, Break(chain, row.pk, expected_seq, f"row with chain_seq {expected_seq} is missing (deleted?)")
        if row.prev_hash != expected_prev:
            return checked, expected_prev, Break(chain, row.pk, row.chain_seq, "its link to the previous row does not match")
        if not hmac.compare_digest(hasher(row), row.row_hash):
            return checked, expected_prev, Break(chain, row.pk, row.chain_seq,
                                                 "its content does not match its keyed hash (edited, or rehashed without the key?)")
        expected_prev = row.row_hash
        expected_seq += 1
        checked += 1
    if head_seq is not None and head_seq != checked:
        return checked, expected_prev, Break(chain, None, checked + 1,
                                             f"the chain head says {head_seq} rows, found {checked} (rows deleted at the end?)")
    return checked, expected_prev, None


def _tool_rows(tenant_id: int) -> Iterator[ToolCallAudit]:
    return ToolCallAudit.objects.filter(tenant_id=tenant_id, chain_seq__isnull=False).order_by("chain_seq").iterator(chunk_size=2000)


def verify_tenant(tenant_id: int) -> tuple[int, Break | None]:
    """Walk a tenant's sealed tool-call rows in chain order; return how many were checked and the first break."""
    head = AuditChainHead.objects.filter(tenant_id=tenant_id).first()
    checked, _last, brk = _walk(f"tools:{tenant_id}", _tool_rows(tenant_id), digest, head.seq if head is not None else None)
    return checked, brk


def verify_changes(chain: str) -> tuple[int, Break | None]:
    """Walk one configuration-change chain (``tenant:<id>`` or ``platform``)."""
    head = ConfigChainHead.objects.filter(chain=chain).first()
    rows = ConfigChange.objects.filter(chain=chain, chain_seq__isnull=False).order_by("chain_seq").iterator(chunk_size=2000)
    checked, _last, brk = _walk(f"config:{chain}", rows, change_digest, head.seq if head is not None else None)
    return checked, brk


def unchained_changes(tenant_ids: Iterable[int] | None = None) -> int:
    """Configuration changes written around ``append_change`` (no place in a chain): each one is suspect."""
    rows = ConfigChange.objects.filter(chain_seq__isnull=True)
    return (rows.filter(tenant_id__in=list(tenant_ids)) if tenant_ids is not None else rows).count()


# --- exported heads: a small signed record kept elsewhere, to catch a deleted tail ----------------------------------


def _chained(name: str) -> Any:
    """The rows of one chain by its exported name (``tools:<tenant id>`` or ``config:<chain>``)."""
    kind, _, ident = name.partition(":")
    if kind == "tools":
        return ToolCallAudit.objects.filter(tenant_id=int(ident), chain_seq__isnull=False)
    return ConfigChange.objects.filter(chain=ident, chain_seq__isnull=False)


def current_heads() -> dict[str, dict[str, Any]]:
    """Per chain: the head's seq and hash, the head row's id and time, and how many rows the chain holds."""
    heads = {f"tools:{h.tenant_id}": (h.seq, h.hash) for h in AuditChainHead.objects.all()}
    heads.update({f"config:{h.chain}": (h.seq, h.hash) for h in ConfigChainHead.objects.all()})
    out: dict[str, dict[str, Any]] = {}
    for name, (seq, hash_) in sorted(heads.items()):
        rows = _chained(name)
        row = rows.filter(chain_seq=seq).only("pk", "created_at").first() if seq else None
        out[name] = {"seq": seq, "hash": hash_, "rows": rows.count(), "row_id": row.pk if row is not None else None,
                     "at": row.created_at.isoformat() if row is not None else None}
    return out


def export_heads() -> dict[str, Any]:
    body = {"format": "agentops-audit-heads/1", "exported_at": timezone.now().isoformat(), "chains": current_heads()}
    return {**body, "signature": _mac("exported heads", body)}


def check_against(record: Any) -> list[str]:
    """Problems with the database compared with an exported record (empty: every exported row is still there)."""
    if not isinstance(record, dict) or not isinstance(record.get("chains"), dict) or "signature" not in record:
        return ["the exported record is not an agentops audit-heads file"]
    body = {k: v for k, v in record.items() if k != "signature"}
    if not hmac.compare_digest(_mac("exported heads", body), str(record["signature"])):
        return ["the exported record's signature does not match (the file was changed, or another key signed it)"]
    problems: list[str] = []
    for name, exported in sorted(record["chains"].items()):
        seq, want, count = int(exported.get("seq", 0)), str(exported.get("hash", "")), int(exported.get("rows", 0))
        if seq == 0:
            continue
        rows = _chained(name)
        row = rows.filter(chain_seq=seq).only("pk", "row_hash").first()
        where = f"row {seq} (audit row {exported.get('row_id')})"
        if row is None:
            problems.append(f"{name}: {where} of the exported head is gone (rows deleted at the end of the chain?)")
        elif not hmac.compare_digest(row.row_hash, want):
            problems.append(f"{name}: {where} no longer has the exported hash (the chain was rewritten)")
        elif (now := rows.count()) < count:
            problems.append(f"{name}: {now} rows where the exported record had {count} (rows deleted)")
    return problems

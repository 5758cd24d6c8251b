"""Hash-chaining of tool-call audit rows, per tenant.

When a row reaches its final status it is sealed: it gets the tenant's next ``chain_seq``, the
previous row's hash, and its own hash over its content and that link. Editing or deleting a
sealed row breaks the chain at that row, which ``manage.py verify_audit`` reports.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from audit.models import AuditChainHead, ToolCallAudit

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


def digest(row: ToolCallAudit) -> str:
    data: dict[str, Any] = {name: getattr(row, name) for name in HASHED_FIELDS}
    data["run_id"] = str(data["run_id"]) if data["run_id"] is not None else None
    data["session_id"] = str(data["session_id"]) if data["session_id"] is not None else None
    data["created_at"] = row.created_at.isoformat(timespec="microseconds")
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_sealed(writes: list[Any], tenant_id: int) -> None:
    """Seal and write a step's audit rows. Call inside the step's transaction.

    ``writes`` are gateway AuditWrite items: a new row, or the completion of a ``started`` row.
    """
    AuditChainHead.objects.bulk_create([AuditChainHead(tenant_id=tenant_id)], ignore_conflicts=True)
    head = AuditChainHead.objects.select_for_update().get(tenant_id=tenant_id)
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
                    "status",
                    "error",
                    "latency_ms",
                    "result_size",
                    "arguments_summary",
                    "chain_seq",
                    "prev_hash",
                    "row_hash",
                    "span_id",
                )
            }
            ToolCallAudit.objects.filter(pk=write.started_pk).update(**fields)
    ToolCallAudit.objects.bulk_create(new_rows)
    head.save(update_fields=["seq", "hash"])


@dataclass(frozen=True)
class Break:
    tenant_id: int
    row_id: int | None
    chain_seq: int
    reason: str


def verify_tenant(tenant_id: int) -> tuple[int, Break | None]:
    """Walk a tenant's sealed rows in chain order; return how many were checked and the first break."""
    expected_prev = ""
    expected_seq = 1
    checked = 0
    rows: Iterator[ToolCallAudit] = (
        ToolCallAudit.objects.filter(tenant_id=tenant_id, chain_seq__isnull=False).order_by("chain_seq").iterator(chunk_size=2000)
    )
    for row in rows:
        assert row.chain_seq is not None
        if row.chain_seq != expected_seq:
            return checked, Break(tenant_id, row.pk, expected_seq, f"row with chain_seq {expected_seq} is missing (deleted?)")
        if row.prev_hash != expected_prev:
            return checked, Break(tenant_id, row.pk, row.chain_seq, "its link to the previous row does not match")
        if digest(row) != row.row_hash:
            return checked, Break(tenant_id, row.pk, row.chain_seq, "its content does not match its hash (edited?)")
        expected_prev = row.row_hash
        expected_seq += 1
        checked += 1
    head = AuditChainHead.objects.filter(tenant_id=tenant_id).first()
    if head is not None and head.seq != checked:
        return checked, Break(
            tenant_id, None, checked + 1, f"the chain head says {head.seq} rows, found {checked} (rows deleted at the end?)"
        )
    return checked, None

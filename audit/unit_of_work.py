"""A step's audit rows as an explicit unit of work: the tool gateway adds them, the run store commits them.

The rows are written (sealed into the tenant's hash chain) in the step's own transaction, or not at all: a step
that is not committed (its lease was lost, the worker died) leaves no audit row claiming it happened. Before this,
the store and the gateway shared a bare list.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from audit.chain import write_sealed
from audit.models import AuditChainHead
from core.batch import WriteBatch


class StepAudit:
    """The audit writes of the step in progress (gateway ``AuditWrite`` items: a new row, or a started row's end)."""

    def __init__(self) -> None:
        self._writes: list[Any] = []

    def add(self, write: Any) -> None:
        self._writes.append(write)

    @property
    def pending(self) -> tuple[Any, ...]:
        return tuple(self._writes)

    def commit(self, tenant_id: int, batch: WriteBatch | None = None, head: AuditChainHead | None = None) -> int:
        """Seal and write the pending rows; call inside the step's transaction. Returns how many were written.

        With ``batch``, the writes join the step's single write statement (the caller executes it); with
        ``head``, the chain head the caller locked in this transaction (see ``audit.chain.write_sealed``).
        """
        count = len(self._writes)
        if count:
            write_sealed(self._writes, tenant_id, batch, head)
        self._writes = []
        return count

    def restore(self, writes: tuple[Any, ...]) -> None:
        """The writes of a commit that was rolled back (it lost a deadlock), to be sealed and written again: new rows
        forget the primary key their rolled-back insert may have given them."""
        self._writes = list(writes)
        forget_keys(self._writes)

    def discard(self) -> None:
        """The step was not committed: its rows are dropped with it."""
        self._writes = []

    def __len__(self) -> int:
        return len(self._writes)

    def __iter__(self) -> Iterator[Any]:
        return iter(tuple(self._writes))

    def __getitem__(self, index: int) -> Any:
        return self._writes[index]


def forget_keys(writes: Any) -> None:
    """New rows among ``writes`` (not a ``started`` row's completion) as before their rolled-back insert."""
    for write in writes:
        if write.started_pk is None:
            write.row.pk = None

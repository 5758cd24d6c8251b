"""The writes of one transaction sent to PostgreSQL as ONE statement (data-modifying CTEs), elsewhere one by one.

A step's commit writes to four or five tables (events, messages, audit rows, the audit chain head, the run's
checkpoint). None of those writes needs another's result, so on PostgreSQL they are joined into one
``WITH w0 AS (INSERT …), w1 AS (INSERT …), … UPDATE …`` statement: one round trip instead of one per table.
The SQL of each part is Django's own (``InsertQuery``/``UpdateQuery`` compilers: same field preparation,
defaults, JSON adaptation, the same ``UNNEST`` multi-row insert), only no ids are returned.

Rules for what a batch may hold (PostgreSQL's for data-modifying CTEs): no row may be changed by two parts,
and no part sees another's effects (they all run on the statement's snapshot). Inserted objects get no
primary key back (``pk`` stays ``None`` for auto ids). On other databases (SQLite in development and tests)
each part runs at once through the ORM, in order, exactly as ``bulk_create``/``update`` would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models import sql as orm_sql


class WriteBatch:
    """INSERTs and UPDATEs to send together; call ``execute`` inside the transaction, before anything reads them."""

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self.combine = connections[using].vendor == "postgresql"
        self._parts: list[tuple[str, tuple[Any, ...]]] = []

    def insert(self, model: type[Model], objs: Iterable[Model]) -> None:
        """As ``model.objects.bulk_create(objs)``, without returning ids."""
        rows = list(objs)
        if not rows:
            return
        if not self.combine:
            model._default_manager.using(self.using).bulk_create(rows)
            return
        opts = model._meta
        for obj in rows:
            if obj.pk is None:  # a default primary key (a UUID) is set here, as bulk_create does
                obj.pk = opts.pk.get_pk_value_on_save(obj)
        with_pk = [obj.pk is not None for obj in rows]
        if any(with_pk) and not all(with_pk):
            raise ValueError("a WriteBatch insert takes objects that all have a primary key, or none")
        fields = [f for f in opts.concrete_fields if not f.generated and (all(with_pk) or f is not opts.pk)]
        connection = connections[self.using]
        size = max(connection.ops.bulk_batch_size(fields, rows), 1)  # as bulk_create batches (parameter limits)
        for start in range(0, len(rows), size):
            query = orm_sql.InsertQuery(model)
            query.insert_values(fields, rows[start : start + size], raw=False)
            statements = query.get_compiler(using=self.using).as_sql()
            self._parts.extend((statement, tuple(params)) for statement, params in statements)
        for obj in rows:
            obj._state.adding = False
            obj._state.db = self.using

    def update(self, queryset: QuerySet[Any], **values: Any) -> None:
        """As ``queryset.update(**values)`` (the number of rows changed is not returned)."""
        if not self.combine:
            queryset.update(**values)
            return
        query = queryset.query.chain(orm_sql.UpdateQuery)
        query.clear_ordering(force=True)
        query.add_update_values(values)
        statement, params = query.get_compiler(using=self.using).as_sql()
        if statement:
            self._parts.append((statement, tuple(params)))

    def __len__(self) -> int:
        return len(self._parts)

    def execute(self) -> None:
        """Send what is pending as one statement (PostgreSQL); elsewhere everything already ran."""
        parts, self._parts = self._parts, []
        if not parts:
            return
        *heads, (last, last_params) = parts
        statement = last
        params: list[Any] = []
        if heads:
            ctes = ", ".join(f"w{i} AS ({sql})" for i, (sql, _) in enumerate(heads))
            statement = f"WITH {ctes} {last}"
            for _, p in heads:
                params.extend(p)
        params.extend(last_params)
        with connections[self.using].cursor() as cursor:
            cursor.execute(statement, params)

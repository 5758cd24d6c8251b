"""The writes of one transaction sent to PostgreSQL as ONE statement (data-modifying CTEs), elsewhere one by one.

A step's commit writes to four or five tables (events, messages, audit rows, the audit chain head, the run's
checkpoint). None of those writes needs another's result, so on PostgreSQL they are joined into one
``WITH w0 AS (INSERT …), w1 AS (INSERT …), … UPDATE …`` statement: one round trip instead of one per table.
An INSERT of any number of rows is one statement whose
text depends only on the model, ``INSERT INTO t (cols) SELECT cols FROM jsonb_populate_recordset(NULL::t, %s)``,
with the rows as ONE JSON parameter: PostgreSQL's own input functions read each column from its JSON value (a
``jsonb`` column takes the value as it is, a JSON ``null`` is SQL ``NULL``). Django's insert compiler would bind
one array per column (``UNNEST``), which psycopg dumps element by element in Python: for a step's eleven events
that was about 0.5 ms of CPU against 0.2 ms this way (bench/README.md). Defaults and ``pre_save`` (``auto_now``)
are applied as ``bulk_create`` applies them; a model with a field this JSON form cannot carry as it is (binary,
decimal, a JSON field with its own encoder) is inserted by ``bulk_create`` itself when the batch is executed. No ids
are returned.
Updates matched on plain equalities (``update_where``) are the same idea: ``UPDATE t SET … FROM
jsonb_to_recordset(%s) AS v(…) WHERE t.k = v.k …``, one part for every row of a model updated with the same fields
(a flow wave's completed nodes), its text cached per shape; an update of a queryset (``update``) is the queryset's
own ``update()``, run when the batch is executed, before the joined statement (the ORM's SQL is not taken apart here:
``django.db.models.sql`` is Django's internals).

Rules for what a batch may hold (PostgreSQL's for data-modifying CTEs): no row may be changed by two parts,
and no part sees another's effects (they all run on the statement's snapshot). Inserted objects get no
primary key back (``pk`` stays ``None`` for auto ids). On other databases (SQLite in development and tests)
each part runs at once through the ORM, in order, exactly as ``bulk_create``/``update`` would. A batch is executed
inside a real transaction (``transaction.atomic()``), or, for :meth:`WriteBatch.execute_guarded`, as one autocommitted
statement of its own; the connection's transaction state is Django's alone.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any, cast

from django.conf import settings
from django.db import connections
from django.db.models import DateField, DateTimeField, Field, JSONField, Model, QuerySet

from core import fastjson


class WriteBatch:
    """INSERTs and UPDATEs to send together; call ``execute`` inside the transaction, before anything reads them."""

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self.combine = connections[using].vendor == "postgresql"
        self._parts: list[tuple[str, tuple[Any, ...]]] = []
        #: per part, how to make it wait on a guard (``execute_guarded``): appended to its SQL; None when it cannot
        self._gates: list[str | None] = []
        #: writes the joined statement cannot hold, made through the ORM when the batch is executed (first)
        self._orm: list[Callable[[], Any]] = []
        #: update_where's rows by (model, matched fields, set fields): (their plan, their values in field order)
        self._rows: dict[tuple[Any, ...], tuple[tuple[tuple[str, str], list[_Convert], list[_Convert]], list[tuple[Any, ...]]]] = {}

    def insert(self, model: type[Model], objs: Iterable[Model]) -> None:
        """As ``model.objects.bulk_create(objs)``, without returning ids."""
        rows = list(objs)
        if not rows:
            return
        if not self.combine:
            model._default_manager.using(self.using).bulk_create(rows)
            return
        pk = model._meta.pk
        if pk.has_default():  # as get_pk_value_on_save: only a Python default gives a value here
            for obj in rows:
                if obj.pk is None:  # a default primary key (a UUID) is set here, as bulk_create does
                    obj.pk = pk.get_pk_value_on_save(obj)
        attname = pk.attname
        with_pk = [obj.__dict__.get(attname) is not None for obj in rows]
        if any(with_pk) and not all(with_pk):
            raise ValueError("a WriteBatch insert takes objects that all have a primary key, or none")
        plan = _json_insert(model, all(with_pk), self.using)
        if plan is not None:
            statement, build = plan
            self._parts.append((statement, _rows_param([build(obj) for obj in rows])))
            self._gates.append(_WHERE_GUARD)
        else:
            self._compiled_inserts(model, rows)
        for obj in rows:
            obj._state.adding = False
            obj._state.db = self.using

    def _compiled_inserts(self, model: type[Model], rows: list[Model]) -> None:
        """A model whose fields the JSON form cannot carry: ``bulk_create`` itself, when the batch is executed."""
        manager = model._default_manager.using(self.using)
        self._orm.append(lambda: manager.bulk_create(rows))

    def update(self, queryset: QuerySet[Any], **values: Any) -> None:
        """As ``queryset.update(**values)`` (the number of rows changed is not returned); on PostgreSQL run when the
        batch is executed, before its joined statement."""
        if not self.combine:
            queryset.update(**values)
            return
        self._orm.append(lambda: queryset.update(**values))

    def update_where(self, model: type[Model], match: dict[str, Any], **values: Any) -> None:
        """As ``model.objects.filter(**match).update(**values)``, for equality matches on non-null values. On
        PostgreSQL the updates of one model with the same fields matched and set are ONE part (``UPDATE … FROM
        jsonb_to_recordset(…)``, its text the same for any number of rows: prepared once); no two of them may match
        the same row. Values that are expressions (``F()``) go through Django's compiler, as :meth:`update`."""
        shape = (model, tuple(match), tuple(values))
        plan = None
        if self.combine and None not in match.values() and not any(hasattr(v, "resolve_expression") for v in values.values()):
            plan = _json_update(model, shape[1], shape[2], self.using)
        if plan is None:
            self.update(model._default_manager.filter(**match), **values)
            return
        self._rows.setdefault(shape, (plan, []))[1].append((*match.values(), *values.values()))

    def __len__(self) -> int:
        return len(self._parts) + len(self._rows) + len(self._orm)

    def execute(self) -> None:
        """Send what is pending as one statement (PostgreSQL); elsewhere everything already ran."""
        orm, self._orm = self._orm, []
        for write in orm:
            write()
        parts = self._take()
        if not parts:
            return
        *heads, (last, last_params) = ((sql, params) for sql, params, _ in parts)
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

    def can_guard(self) -> bool:
        """Whether :meth:`execute_guarded` can send what is pending (PostgreSQL, every part in the JSON form)."""
        return self.combine and not self._orm and all(gate is not None for gate in self._gates)

    def execute_guarded(self, guard: str, guard_params: list[Any]) -> tuple[Any, ...] | None:
        """Send what is pending as ONE statement that writes only if ``guard`` (a ``SELECT … FOR UPDATE`` of the rows
        the writes depend on, with their expected values in its WHERE) finds its row: the guard's row, or None when
        nothing was written. Outside a transaction the statement commits by itself: one round trip for a whole step.
        Every part waits on the guard (``WHERE EXISTS (SELECT 1 FROM g)``), evaluated once, under its locks."""
        if not self.can_guard():
            raise ValueError("execute_guarded needs every part in the JSON form (check can_guard() first)")
        parts = self._take()
        ctes = [f"g AS ({guard})"]
        params: list[Any] = list(guard_params)
        for i, (sql, part_params, gate) in enumerate(parts):
            ctes.append(f"w{i} AS ({sql}{gate})")
            params.extend(part_params)
        with connections[self.using].cursor() as cursor:
            cursor.execute(f"WITH {', '.join(ctes)} SELECT * FROM g", params)  # noqa: S608 (built here from our own parts)
            found = cursor.fetchone()
        return tuple(found) if found is not None else None

    def _take(self) -> list[tuple[str, tuple[Any, ...], str]]:
        """The pending parts with their gates (update_where's rows made into their parts), and the batch emptied."""
        for ((many, one), match, values), rows in self._rows.values():
            converts = [*match, *values]
            objects = [{f"c{i}": convert(value) for i, (convert, value) in enumerate(zip(converts, row, strict=True))}
                       for row in rows]
            if len(objects) == 1:
                self._parts.append((one, (fastjson.dumps(objects[0]),)))
            else:
                self._parts.append((many, _rows_param(objects)))
            self._gates.append(_AND_GUARD)
        self._rows = {}
        parts = [(sql, params, gate or "") for (sql, params), gate in zip(self._parts, self._gates, strict=True)]
        self._parts, self._gates = [], []
        return parts


#: How an INSERT … SELECT (:func:`_json_insert`) and an UPDATE … WHERE (:func:`_json_update`) wait on the guard.
_WHERE_GUARD = " WHERE EXISTS (SELECT 1 FROM g)"
_AND_GUARD = " AND EXISTS (SELECT 1 FROM g)"


def _rows_param(rows: list[dict[str, Any]]) -> tuple[str]:
    """The rows of an INSERT or UPDATE part as its one parameter."""
    return (fastjson.dumps(rows),)


#: How a field's value becomes the JSON value PostgreSQL reads back into its column.
_Convert = Callable[[Any], Any]
#: The same, read from a model instance.
_Reader = Callable[[Model], Any]


@cache
def _json_insert(model: type[Model], with_pk: bool, using: str) -> tuple[str, Callable[[Model], dict[str, Any]]] | None:
    """The statement inserting ``model``'s rows from one JSON array, and how to make an object its row, or None."""
    opts = model._meta
    connection = connections[using]
    quote = connection.ops.quote_name
    columns: list[tuple[str, _Reader]] = []
    direct: list[tuple[str, str, _Convert | None] | None] = []
    for field in opts.concrete_fields:
        if field.generated or (field is opts.pk and not with_pk):
            continue
        reader = _reader(field, connection)
        if reader is None:
            return None
        columns.append((field.column, reader))
        direct.append((field.column, field.attname, _converter(field, connection)) if _plain_save(field) else None)
    names = ", ".join(quote(column) for column, _ in columns)
    table = quote(opts.db_table)
    sql = f"INSERT INTO {table} ({names}) SELECT {names} FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb)"  # noqa: S608 (the model's own quoted names)
    return sql, _row_builder(columns, direct)


def _row_builder(columns: list[tuple[str, _Reader]],
                 direct: list[tuple[str, str, _Convert | None] | None]) -> Callable[[Model], dict[str, Any]]:
    """An object's row for the JSON form. Without ``pre_save`` of their own (``auto_now``), its fields' values are read
    from the instance's ``__dict__`` (a step's events: 12 rows of 9 columns, a third of the CPU of a reader each)."""
    if any(item is None for item in direct):
        return lambda obj: {column: value(obj) for column, value in columns}
    items = [(column, attname, None if convert is _same else convert) for column, attname, convert in cast(Any, direct)]

    def build(obj: Model) -> dict[str, Any]:
        values = obj.__dict__
        try:
            return {column: values[attname] if convert is None else convert(values[attname]) for column, attname, convert in items}
        except KeyError:  # a deferred field: read as Django reads it
            return {column: value(obj) for column, value in columns}

    return build


@cache
def _json_update(model: type[Model], match: tuple[str, ...], values: tuple[str, ...],
                 using: str) -> tuple[tuple[str, str], list[_Convert], list[_Convert]] | None:
    """The statements updating ``model``'s rows matched on the ``match`` fields to their own ``values``, from one JSON
    array of rows and from one JSON object (one row), and how to convert each value; or None (this form cannot)."""
    connection = connections[using]
    quote = connection.ops.quote_name
    fields = [model._meta.get_field(name) for name in (*match, *values)]
    found = [_converter(field, connection) for field in fields]
    types = [field.db_type(connection) for field in fields]
    if any(c is None for c in found) or any(t is None for t in types) or any(f.generated for f in fields):
        return None
    converts = cast(list[_Convert], found)
    columns = [f"c{i}" for i in range(len(fields))]
    table = quote(model._meta.db_table)
    assignments = ", ".join(f"{quote(field.column)} = v.{column}"
                            for field, column in zip(fields[len(match):], columns[len(match):], strict=True))
    conditions = " AND ".join(f"{table}.{quote(field.column)} = v.{column}"
                              for field, column in zip(fields[: len(match)], columns[: len(match)], strict=True))
    shape = ", ".join(f"{column} {type_}" for column, type_ in zip(columns, types, strict=True))
    # Two forms: rows from an array (``jsonb_to_recordset``), and one row from one object (``jsonb_to_record``). The
    # planner takes a set-returning function for 100 rows, so the array form joins by scanning the whole table (a
    # run's step updating its one run read every run); the one-row form looks the row up by its index.
    many, one = (f"UPDATE {table} SET {assignments} FROM {function}(%s::jsonb) AS v({shape}) WHERE {conditions}"  # noqa: S608 (the model's own quoted names and types)
                 for function in ("jsonb_to_recordset", "jsonb_to_record"))
    return (many, one), converts[: len(match)], converts[len(match):]


def _plain_save(field: Field[Any, Any]) -> bool:
    """Whether saving takes the field's value as it is (``pre_save`` changes nothing): not ``auto_now`` and the like."""
    if isinstance(field, DateField) and type(field).pre_save in (DateField.pre_save, DateTimeField.pre_save):
        return not (field.auto_now or field.auto_now_add)
    return type(field).pre_save is Field.pre_save


def _reader(field: Field[Any, Any], connection: Any) -> _Reader | None:
    convert = _converter(field, connection)
    if convert is None:
        return None
    if not _plain_save(field):  # auto_now and the like: as bulk_create, pre_save decides
        return lambda obj: convert(field.pre_save(obj, True))
    attname = field.attname
    return lambda obj: convert(getattr(obj, attname))


def _converter(field: Field[Any, Any], connection: Any) -> _Convert | None:
    if isinstance(field, JSONField):
        if field.encoder is not None:
            return None
        return _same  # the document itself, nested in the row: a jsonb column takes it as it is
    kind = field.target_field.get_internal_type() if field.is_relation else field.get_internal_type()
    if kind in {"DateTimeField", "DateField", "TimeField"}:
        aware_as_is = kind == "DateTimeField" and settings.USE_TZ

        def temporal(value: Any) -> Any:
            if aware_as_is and type(value) is dt.datetime and value.tzinfo is not None:
                return value.isoformat()  # all the field's preparation would do to an aware time (4x the CPU)
            value = field.get_db_prep_save(value, connection)  # naive datetimes made aware, as Django does
            return None if value is None else value.isoformat()

        return temporal
    if kind == "UUIDField":
        return _uuid_text
    convert = _PLAIN.get(kind)
    if convert is None:
        return None

    def plain(value: Any) -> Any:
        return value if value is None or type(value) is convert else convert(value)  # as get_prep_value: int(), str()

    return plain


def _same(value: Any) -> Any:
    return value


def _uuid_text(value: Any) -> Any:
    return None if value is None else str(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))


#: Field types whose value is a JSON string, number or boolean, and the Python type Django's get_prep_value makes it.
_PLAIN: dict[str, type] = {
    **dict.fromkeys(("AutoField", "BigAutoField", "SmallAutoField", "IntegerField", "BigIntegerField", "SmallIntegerField",
                     "PositiveIntegerField", "PositiveBigIntegerField", "PositiveSmallIntegerField"), int),
    "BooleanField": bool,
    **dict.fromkeys(("CharField", "TextField", "SlugField", "EmailField", "URLField"), str),
}

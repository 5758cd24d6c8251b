"""Hot reads whose SQL Django compiles once per shape, then runs again with new values (PostgreSQL).

Building a queryset and compiling it (``filter()``, ``add_q``, the compiler's ``select_related`` walk) costs more CPU
than PostgreSQL spends answering a small indexed read: in a py-spy profile of ``bench/throughput.py`` it was about a
sixth of the server's and the worker's CPU. A ``CompiledRead`` wraps a function that builds the queryset from its
arguments. The first call of a *shape* (the types of the arguments, the length of each list) builds it once with
placeholder values of the same types, compiles it and finds each placeholder among the statement's parameters;
later calls bind the real values to the same text and build the model instances as Django's ``ModelIterable`` does
(``from_db``, the fields' converters, ``select_related`` populators). The SQL is Django's own; nothing is written by
hand.

A shape whose values Django transforms before binding (``__icontains`` wraps them in ``%``, SQLite writes UUIDs as
text), or that cannot be built from placeholders, is not compiled: it runs through the ORM every time, as does
everything on SQLite. Arguments must be of the field's own type (an ``int`` id, a ``str`` name, a ``UUID``); model
instances are not accepted (pass their ids). The builder must use its arguments as filter values only: not to slice
(a value written into the SQL text is refused, the shape stays with the ORM) and not to decide anything in Python
(a shape is built once, with placeholders).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import connection
from django.db.models import Model, QuerySet
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query import ModelIterable, get_related_populators
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init
from django.db.transaction import TransactionManagementError

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Model)

#: Types a placeholder can stand for (bool is a subclass of int, so it is a shape key, never a placeholder).
_SCALARS = (int, str, uuid.UUID, dt.datetime)


def _placeholder(kind: type, n: int) -> Any:
    if kind is str:
        return f"\x00compiled-read-{n}\x00"  # NUL: no stored text can hold it, so it is never a real value
    if kind is int:
        return 1_900_000_000 + n
    if kind is uuid.UUID:
        return uuid.UUID(int=(0xC0 << 120) + n)
    return dt.datetime(1901, 1, 1, 0, 0, 0, n, tzinfo=dt.UTC)


def _kind(value: Any) -> Any:
    """The shape an argument gives: its type, a list's length and element type, or the value itself (bool, None)."""
    if value is None or isinstance(value, bool):
        return ("value", value)
    if isinstance(value, _SCALARS):
        return type(value)
    if isinstance(value, list | tuple) and all(isinstance(v, _SCALARS) and not isinstance(v, bool) for v in value):
        kinds = {type(v) for v in value}
        if len(kinds) <= 1:
            return ("list", len(value), kinds.pop() if kinds else None)
    return ("unsupported",)


@dataclass(frozen=True)
class _Shape:
    sql: str
    params: tuple[Any, ...]  # each a constant, or a (arg index, item index or -1) slot marker
    slots: tuple[int, ...]  # positions in params that are slots
    model: type[Model]
    init_list: list[str]
    start: int
    end: int
    converters: list[tuple[int, tuple[list[Callable[..., Any]], Any]]]
    populators: list[Any]
    annotations: dict[str, int]
    locks: bool  # SELECT ... FOR UPDATE: only inside a transaction, as Django says
    columns: tuple[str, ...] | None  # each column's name in a row dict (attname, "agent__slug", an annotation's)


#: psycopg's integer types Django binds an integer field's value as, and the values each holds (-bound <= v < bound).
_INT_BOUNDS = {"Int2": 2**15, "Int4": 2**31, "Int8": 2**63}


class _OutOfRange(Exception):
    """A value its column's integer type cannot hold: the ORM answers that call."""


@dataclass(frozen=True)
class _Slot:
    arg: int
    item: int  # -1 for a scalar argument
    wrap: Any = None  # the type Django bound the value as (psycopg's Int4 for an IntegerField), to bind it the same way


class CompiledRead(Generic[M]):
    """``read = CompiledRead(lambda tenant_id, names: Tool.objects.filter(...))``; ``read(5, ["a", "b"])`` is a list."""

    def __init__(self, build: Callable[..., QuerySet[M]]) -> None:
        self.build = build
        self._shapes: dict[tuple[Any, ...], _Shape | None] = {}
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> list[M]:
        if connection.vendor != "postgresql":
            return list(self.build(*args))
        key = tuple(_kind(a) for a in args)
        try:
            shape = self._shapes[key]
        except KeyError:
            shape = self._compile(key, args)
        if shape is None:
            return list(self.build(*args))
        try:
            return self._run(shape, args)
        except _OutOfRange:  # the ORM answers it (Django turns an out-of-range integer into an empty or full match)
            return list(self.build(*args))

    def dicts(self, *args: Any) -> list[dict[str, Any]] | None:
        """The rows as dicts, each column by its name (``created_at``, ``agent_id``, ``agent__slug`` for a
        ``select_related`` field, an annotation's name), converted as the model's fields convert them, with no model
        instance made: for a page whose rows are only written out (agents/api.py, the runs list). None when this
        shape is not compiled (SQLite, or a shape the ORM answers): call the read itself then."""
        if connection.vendor != "postgresql":
            return None
        key = tuple(_kind(a) for a in args)
        try:
            shape = self._shapes[key]
        except KeyError:
            shape = self._compile(key, args)
        if shape is None or shape.columns is None:
            return None
        columns = shape.columns
        try:
            rows = self._rows(shape, args)
        except _OutOfRange:
            return None
        return [dict(zip(columns, row, strict=False)) for row in rows]  # past them: ordering columns

    def first(self, *args: Any) -> M | None:
        rows = self(*args)
        return rows[0] if rows else None

    def get(self, *args: Any) -> M:
        """The one row, or the model's ``DoesNotExist`` (as ``QuerySet.get``; the builder narrows to one row)."""
        row = self.first(*args)
        if row is None:
            model = self.build(*args).model  # built, not run: only on this rare path
            raise model.DoesNotExist(f"No {model.__name__} matches the given query.")
        return row

    # -- compiling a shape ------------------------------------------------------------------------------------------

    def _compile(self, key: tuple[Any, ...], args: Sequence[Any]) -> _Shape | None:
        with self._lock:
            if key in self._shapes:
                return self._shapes[key]
            shape = None
            if not any(k == ("unsupported",) for k in key):
                try:
                    shape = self._shape(args)
                except Exception as exc:  # the builder refused placeholders: the ORM answers this shape
                    log.debug("compiled read %r: shape %r not compiled: %s", self.build, key, exc)
            self._shapes[key] = shape
            return shape

    def _shape(self, args: Sequence[Any]) -> _Shape | None:
        markers: dict[tuple[type, Any], _Slot] = {}
        stand_ins: list[Any] = []
        n = 0
        for index, arg in enumerate(args):
            kind = _kind(arg)
            if isinstance(kind, type):
                value = _placeholder(kind, n)
                markers[(kind, value)] = _Slot(index, -1)
                n += 1
                stand_ins.append(value)
            elif kind[0] == "list":
                items = []
                for item in range(kind[1]):
                    value = _placeholder(kind[2], n)
                    markers[(kind[2], value)] = _Slot(index, item)
                    n += 1
                    items.append(value)
                stand_ins.append(type(arg)(items))
            else:
                stand_ins.append(arg)
        queryset = self.build(*stand_ins)
        if queryset._iterable_class is not ModelIterable or queryset._known_related_objects or queryset._prefetch_related_lookups:
            return None
        compiler = queryset.query.get_compiler(using=queryset.db)
        sql, raw_params = compiler.as_sql()
        params: list[Any] = []
        slots: list[int] = []
        found: set[_Slot] = set()
        for position, param in enumerate(raw_params):
            slot = markers.get((type(param), param)) if isinstance(param, _SCALARS) else None
            bound_as = None
            if slot is None and isinstance(param, int) and type(param) not in (int, bool):
                # Django binds an IntegerField's value as psycopg's Int4 (Int2, Int8): an int of another type
                slot, bound_as = markers.get((int, int(param))), type(param)
            if slot is not None:
                slots.append(position)
                found.add(slot)
                params.append(slot if bound_as is None else _Slot(slot.arg, slot.item, bound_as))
            else:
                params.append(param)
        if len(found) != len(markers):  # a value was transformed (or dropped): this shape stays with the ORM
            return None
        if any(str(value) in sql for _, value in markers):  # a value written into the text (a slice): the same
            return None
        select, klass_info = compiler.select, compiler.klass_info
        columns = _column_names(select, klass_info, compiler.annotation_col_map or {}, compiler.col_count)
        fields = klass_info["select_fields"]
        start, end = fields[0], fields[-1] + 1
        converters = compiler.get_converters([s[0] for s in select[0:compiler.col_count]])
        return _Shape(
            sql=sql,
            params=tuple(params),
            slots=tuple(slots),
            model=klass_info["model"],
            init_list=[f[0].target.attname for f in select[start:end]],
            start=start,
            end=end,
            converters=list(converters.items()),
            populators=get_related_populators(klass_info, select, queryset.db),
            annotations=dict(compiler.annotation_col_map or {}),
            locks=bool(queryset.query.select_for_update),
            columns=columns,
        )

    # -- running it -------------------------------------------------------------------------------------------------

    def _run(self, shape: _Shape, args: Sequence[Any]) -> list[M]:
        """Django's ``ModelIterable`` over the bound statement; instances made as :func:`_instance` says."""
        db = connection.alias
        return [_from_row(row, shape.model, db, shape.init_list, shape.start, shape.end, shape.populators,  # type: ignore[misc]
                          shape.annotations) for row in self._rows(shape, args)]

    def _rows(self, shape: _Shape, args: Sequence[Any]) -> list[list[Any]]:
        """The bound statement's rows, each value converted as its field converts it (``from_db_value``)."""
        if shape.locks and connection.get_autocommit():
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        params = list(shape.params)
        for position in shape.slots:
            slot = params[position]
            value = args[slot.arg] if slot.item < 0 else args[slot.arg][slot.item]
            if slot.wrap is not None:
                bound = _INT_BOUNDS.get(slot.wrap.__name__, 2**63)
                if not -bound <= value < bound:
                    raise _OutOfRange
                value = slot.wrap(value)
            params[position] = value
        with connection.cursor() as cursor:
            cursor.execute(shape.sql, params)
            rows = cursor.fetchall()
        converted: list[list[Any]] = []
        for raw in rows:
            row = list(raw)
            for position, (convs, expression) in shape.converters:
                value = row[position]
                for convert in convs:
                    value = convert(value, expression, connection)
                row[position] = value
            converted.append(row)
        return converted


def _column_names(select: Sequence[Any], klass_info: dict[str, Any], annotations: dict[str, int],
                  count: int) -> tuple[str, ...] | None:
    """Each selected column's name for :meth:`CompiledRead.dicts`: the model's attnames, a ``select_related``
    model's prefixed by the relation (``agent__slug``), annotations by their names; None if one has none."""
    names: list[str | None] = [None] * count

    def walk(info: dict[str, Any], prefix: str) -> None:
        for position in info["select_fields"]:
            names[position] = prefix + select[position][0].target.attname
        for child in info.get("related_klass_infos", []):
            if child.get("reverse"):
                raise ValueError("a reverse one-to-one relation")
            walk(child, prefix + child["field"].name + "__")

    try:
        walk(klass_info, "")
    except (ValueError, AttributeError, KeyError):
        return None
    for name, position in annotations.items():
        names[position] = name
    if any(name is None for name in names) or len(set(names)) != len(names):
        return None
    return tuple(names)  # type: ignore[arg-type]


def _from_row(row: list[Any], model: type[Model], db: str, attnames: list[str], start: int, end: int,
              populators: list[Any], annotations: dict[str, int]) -> Model:
    """One converted row as ``ModelIterable`` makes it: the instance, its ``select_related`` objects, annotations."""
    obj = _instance(model, db, attnames, row[start:end])
    for populator in populators:
        _populate(populator, row, obj)
    for name, position in annotations.items():
        setattr(obj, name, row[position])
    return obj


def _instance(model: type[Model], db: str, attnames: Sequence[str], values: Sequence[Any]) -> Model:
    """What ``model.from_db(db, attnames, values)`` makes, without running ``Model.__init__`` (its signals, its
    per-field ``setattr``: a tenth of a server's CPU on a page of runs): the loaded values go straight into the
    instance's ``__dict__``, where ``__init__`` would have put them. Only for a model that changes nothing of that
    (its own ``__init__`` or ``from_db``, a field whose attribute is not Django's plain one) and while no
    ``pre_init``/``post_init`` receiver is connected; anything else is made by ``from_db`` itself."""
    if not _fast(model):
        return model.from_db(db, attnames, list(values))
    return _filled(model, db, attnames, values)


def new_instance(model: type[Model], attnames: Sequence[str], values: Sequence[Any]) -> Model:
    """What ``model(**dict(zip(attnames, values)))`` makes — an unsaved instance of every concrete field's value —
    the way :func:`_instance` makes a loaded one (a step's dozen RunEvent rows: agents/store.py ``event_rows``)."""
    if not _fast(model):
        return model(**dict(zip(attnames, values, strict=True)))
    return _filled(model, None, attnames, values)


def new_with_defaults(model: type[Model], values: dict[str, Any]) -> Model:
    """What ``model(**values)`` makes when ``values`` are given by attribute name (``run_id``, not ``run``): a field
    not given takes its default, evaluated now (``timezone.now``, ``list``), as ``Model.__init__`` evaluates it — a
    tool call's audit row, a step or a wave at a time (tools/gateway.py). Anything else in ``values`` (a relation's
    object, an unknown name) goes to the constructor, which takes it or says what is wrong."""
    fields = _CONCRETE.get(model)
    if fields is None:
        every = model._meta.concrete_fields
        fields = _CONCRETE[model] = (tuple(every), tuple(f.attname for f in every), frozenset(f.attname for f in every))
    every, attnames, names = fields
    if not names.issuperset(values):
        return model(**values)
    return new_instance(model, attnames, [values[f.attname] if f.attname in values else f.get_default() for f in every])


_CONCRETE: dict[type[Model], tuple[tuple[Any, ...], tuple[str, ...], frozenset[str]]] = {}


def _fast(model: type[Model]) -> bool:
    return _plain(model) and not pre_init.receivers and not post_init.receivers


def _filled(model: type[Model], db: str | None, attnames: Sequence[str], values: Sequence[Any]) -> Model:
    obj = model.__new__(model)
    state = ModelState()
    state.adding = db is None
    state.db = db
    attributes = obj.__dict__
    attributes["_state"] = state
    attributes.update(zip(attnames, values, strict=True))
    return obj


def json_column(value: Any) -> Any:
    """A JSON column's value read with a raw cursor: Django leaves PostgreSQL's jsonb as its text (its field decodes it)."""
    return json.loads(value) if isinstance(value, str) else value


_PLAIN: dict[type[Model], bool] = {}


def _plain(model: type[Model]) -> bool:
    plain = _PLAIN.get(model)
    if plain is None:
        plain = _PLAIN[model] = (
            model.__init__ is Model.__init__
            and getattr(model.from_db, "__func__", None) is getattr(Model.from_db, "__func__", None)
            and all(type(_mro_attribute(model, f.attname)) in _PLAIN_DESCRIPTORS for f in model._meta.concrete_fields)
        )
    return plain


#: The attributes Django gives a concrete field: a value in the instance's ``__dict__`` is what they read.
_PLAIN_DESCRIPTORS = (DeferredAttribute, ForeignKeyDeferredAttribute)


def _mro_attribute(model: type, name: str) -> Any:
    for klass in model.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


def _populate(populator: Any, row: list[Any], from_obj: Model | None) -> None:
    """``RelatedPopulator.populate`` (Django 5.2), with :func:`_instance` for the related object."""
    data = populator.reorder_for_init(row) if populator.reorder_for_init else row[populator.cols_start:populator.cols_end]
    if data[populator.pk_idx] is None:
        obj = None
    else:
        obj = _instance(populator.model_cls, populator.db, populator.init_list, data)
        for child in populator.related_populators:
            _populate(child, row, obj)
    populator.local_setter(from_obj, obj)
    if obj is not None:
        populator.remote_setter(obj, from_obj)

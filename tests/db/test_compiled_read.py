"""config/compiled.py: a read compiled once per shape answers exactly what the ORM answers, with one statement, and
without building or compiling the queryset again; shapes it cannot carry stay with the ORM (and SQLite always does)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.db.models import Count, Model
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.models import Run, Session
from config.compiled import CompiledRead
from marketplace.installs import install_plugin
from tenants.scoping import actor_for_user
from tests.factories import World, make_user, make_world
from tools.models import Tool

pytestmark = pytest.mark.django_db

ON_POSTGRES = connection.vendor == "postgresql"


@pytest.fixture
def world() -> World:
    return make_world()


def _same(ours: list[Model], theirs: list[Model], related: tuple[str, ...] = ()) -> None:
    assert [type(o) for o in ours] == [type(t) for t in theirs]
    for a, b in zip(ours, theirs, strict=True):
        fields = [f.attname for f in type(a)._meta.concrete_fields]
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
        assert not a._state.adding and a._state.db == b._state.db
        for path in related:
            x, y = a, b
            for name in path.split("__"):
                field = type(x)._meta.get_field(name)
                assert field.is_cached(x) == field.is_cached(y), path
                x, y = getattr(x, name), getattr(y, name)
                if x is None or y is None:
                    assert x is None and y is None, path
                    break
                names = [f.attname for f in type(x)._meta.concrete_fields]
                assert [getattr(x, f) for f in names] == [getattr(y, f) for f in names], path


def _tools(tenant_id: int, names: list[str]) -> Any:
    return Tool.objects.filter(tenant_id=tenant_id, name__in=names).select_related("plugin_install__plugin").order_by("name")


def test_tools_with_a_nullable_related_chain_and_lists_of_any_length(world: World) -> None:
    owner = make_user()
    from accounts import services as tenant_services
    from tenants.models import Role

    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    install_plugin(tenant=world.tenant, plugin_key="order-desk", actor=actor_for_user(owner))
    Tool.objects.create(tenant=world.tenant, name="plain", description="A tool of the tenant's own.", kind="python",
                        parameters={"type": "object", "properties": {}}, config={"x": ["ü", None, 1.5]})
    read = CompiledRead(_tools)
    names = sorted(Tool.objects.filter(tenant=world.tenant).values_list("name", flat=True))
    assert any(t.plugin_install_id for t in Tool.objects.filter(tenant=world.tenant))
    assert any(not t.plugin_install_id for t in Tool.objects.filter(tenant=world.tenant))
    for chosen in (names, names[:1], names[1:3], [], ["no-such-tool"], [*names, *names]):
        _same(read(world.tenant.pk, chosen), list(_tools(world.tenant.pk, chosen)), ("plugin_install", "plugin_install__plugin"))
    # every length compiled, except the empty list (Django answers it without a statement)
    shapes = {key[1][1]: shape for key, shape in read._shapes.items()}
    assert sorted(shapes) == (sorted({len(names), 1, 2, 0, 2 * len(names)}) if ON_POSTGRES else [])
    assert all((shape is None) == (length == 0) for length, shape in shapes.items())
    # another tenant's tools are not the first tenant's
    other = make_world()
    assert {t.tenant_id for t in read(other.tenant.pk, names)} == {other.tenant.pk}


def _runs(run_id: uuid.UUID) -> Any:
    return Run.objects.select_related("tenant", "agent", "version", "session", "attention_resolved_by").filter(pk=run_id)


def test_a_run_with_its_tenant_agent_version_and_session_and_json_and_time_fields(world: World) -> None:
    session = Session.objects.create(tenant=world.tenant, agent=world.agent, facts={"a": [1, {"b": "ü"}]})
    run = Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input="hi",
                             state={"messages": [{"role": "user", "content": "x"}]}, usage={"tokens": 3},
                             started_at=timezone.now())
    resolved = Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session,
                                  input="resolved", attention_resolved_by=world.operator, attention_resolved_at=timezone.now())
    read = CompiledRead(_runs)
    for pk in (run.pk, resolved.pk, uuid.uuid4()):
        _same(read(pk), list(_runs(pk)), ("tenant", "agent", "version", "session", "attention_resolved_by"))
    got = read.first(run.pk)
    assert got is not None and got.state == {"messages": [{"role": "user", "content": "x"}]}
    assert got.session is not None and got.session.facts == {"a": [1, {"b": "ü"}]}
    assert isinstance(got.started_at, dt.datetime) and got.started_at.tzinfo is not None
    assert read.first(uuid.uuid4()) is None
    assert read.get(run.pk).pk == run.pk
    with pytest.raises(Run.DoesNotExist):
        read.get(uuid.uuid4())
    assert [s is not None for s in read._shapes.values()] == ([True] if ON_POSTGRES else [])


@pytest.mark.skipif(not ON_POSTGRES, reason="SQLite always reads through the ORM (checked below)")
def test_a_shape_is_built_and_compiled_once_and_then_runs_as_one_statement(world: World) -> None:
    read = CompiledRead(_tools)
    built = mock.Mock(side_effect=_tools)
    read.build = built
    read(world.tenant.pk, ["query_order", "query_logistics"])  # compiles this shape
    assert built.call_count == 1
    with mock.patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")), \
            CaptureQueriesContext(connection) as queries:
        got = read(world.tenant.pk, ["query_logistics", "sum_order_totals"])
    assert built.call_count == 1 and len(queries) == 1
    assert [t.name for t in got] == ["query_logistics", "sum_order_totals"]
    read(world.tenant.pk, ["query_order"])  # a list of another length is another shape
    assert built.call_count == 2


def _contains(tenant_id: int, fragment: str) -> Any:
    return Tool.objects.filter(tenant_id=tenant_id, name__icontains=fragment).order_by("name")


def _annotated(tenant_id: int) -> Any:
    return Tool.objects.filter(tenant_id=tenant_id).annotate(n=Count("id")).order_by("name")


def _values(tenant_id: int) -> Any:
    return Tool.objects.filter(tenant_id=tenant_id).values_list("name", flat=True)


def _since(tenant_id: int, when: dt.datetime, enabled: bool | None) -> Any:
    queryset = Tool.objects.filter(tenant_id=tenant_id, created_at__gte=when)
    return queryset if enabled is None else queryset.filter(enabled=enabled)


def test_transformed_values_unsupported_arguments_and_other_iterables_stay_with_the_orm(world: World) -> None:
    contains = CompiledRead(_contains)
    assert [t.name for t in contains(world.tenant.pk, "LOGIST")] == ["query_logistics"]  # '%LOGIST%' is not the value
    assert [t.name for t in contains(world.tenant.pk, "order")] == ["query_order", "sum_order_totals"]
    assert list(contains._shapes.values()) == ([None] if ON_POSTGRES else [])
    annotated = CompiledRead(_annotated)
    assert [(t.name, t.n) for t in annotated(world.tenant.pk)] == [(t.name, 1) for t in _annotated(world.tenant.pk)]
    values = CompiledRead(_values)
    assert sorted(values(world.tenant.pk)) == sorted(_values(world.tenant.pk))  # values_list keeps the ORM's answer
    assert list(values._shapes.values()) in ([None], [])
    with pytest.raises(TypeError):  # a model instance where an id is expected: the ORM's own error, not a wrong read
        CompiledRead(lambda t: Tool.objects.filter(tenant_id=t))(object())
    since = CompiledRead(_since)
    hour_ago = timezone.now() - dt.timedelta(hours=1)
    for enabled in (None, True, False):  # a bool or None is part of the shape, never a placeholder
        expected = sorted(t.pk for t in _since(world.tenant.pk, hour_ago, enabled))
        assert sorted(t.pk for t in since(world.tenant.pk, hour_ago, enabled)) == expected
    Tool.objects.filter(tenant=world.tenant, name="query_order").update(enabled=False)
    assert [t.name for t in since(world.tenant.pk, hour_ago, False)] == ["query_order"]
    assert since(world.tenant.pk, timezone.now() + dt.timedelta(hours=1), None) == []


def test_on_sqlite_every_read_goes_through_the_orm(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "vendor", "sqlite")  # the embedded default's branch, on either database
    read = CompiledRead(_tools)
    assert [t.name for t in read(world.tenant.pk, ["query_order"])] == ["query_order"]
    assert read._shapes == {}


def _first_n(tenant_id: int, n: int) -> Any:
    return Tool.objects.filter(tenant_id=tenant_id).order_by("name")[:n]


def test_an_argument_written_into_the_sql_text_keeps_the_shape_with_the_orm(world: World) -> None:
    read = CompiledRead(_first_n)
    assert [t.name for t in read(world.tenant.pk, 1)] == [t.name for t in _first_n(world.tenant.pk, 1)]
    assert [t.name for t in read(world.tenant.pk, 2)] == [t.name for t in _first_n(world.tenant.pk, 2)]
    assert list(read._shapes.values()) == ([None] if ON_POSTGRES else [])


def test_instances_behave_as_the_orm_s_save_defer_and_signal_alike(world: World) -> None:
    from django.db.models.signals import post_init

    read = CompiledRead(lambda tenant_id, name: Tool.objects.filter(tenant_id=tenant_id, name=name).only("id", "name",
                                                                                                          "tenant_id"))
    tool = read.first(world.tenant.pk, "query_order")
    assert tool is not None and not tool._state.adding
    assert tool.get_deferred_fields() == Tool.objects.only("id", "name", "tenant_id").get(pk=tool.pk).get_deferred_fields()
    assert tool.description == Tool.objects.get(pk=tool.pk).description  # a deferred field loads on access
    tool.description = "changed through a compiled read's instance"
    tool.save(update_fields=["description"])  # an UPDATE of the row, not an INSERT of a new one
    assert Tool.objects.get(pk=tool.pk).description == "changed through a compiled read's instance"
    assert Tool.objects.filter(tenant=world.tenant, name="query_order").count() == 1
    seen: list[Any] = []

    def receiver(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance)

    post_init.connect(receiver, sender=Tool)
    try:
        again = read.first(world.tenant.pk, "query_order")
    finally:
        post_init.disconnect(receiver, sender=Tool)
    assert seen == [again]  # a receiver connected: instances are made by Django's own from_db, signals and all


@pytest.mark.django_db(transaction=True)
def test_a_locking_read_outside_a_transaction_is_refused_as_django_refuses_it(world: World) -> None:
    from django.db import transaction
    from django.db.transaction import TransactionManagementError

    read = CompiledRead(lambda tenant_id: Tool.objects.select_for_update().filter(tenant_id=tenant_id).order_by("name"))
    with transaction.atomic():
        assert [t.name for t in read(world.tenant.pk)] == sorted(t.name for t in Tool.objects.filter(tenant=world.tenant))
    if connection.features.has_select_for_update:  # autocommit: refused, as Django's own evaluation is (not on SQLite)
        with pytest.raises(TransactionManagementError):
            read(world.tenant.pk)


def test_rows_as_dicts_name_each_column_and_hold_what_the_orm_holds(world: World) -> None:
    """``CompiledRead.dicts``: no instances; the model's attnames, ``relation__attname`` for a select_related model
    (nested too, and None through a null relation), an annotation by its name."""
    Tool.objects.create(tenant=world.tenant, name="plain", kind="http", config={"url": "https://x.example"})

    def build(tenant_id: int) -> Any:
        return (Tool.objects.filter(tenant_id=tenant_id).select_related("plugin_install__plugin")
                .annotate(double_id=Count("id")).order_by("name"))

    read = CompiledRead(build)
    rows = read.dicts(world.tenant.pk)
    if not ON_POSTGRES:
        assert rows is None  # SQLite: not compiled; the caller reads instances
        return
    assert rows is not None and rows
    expected = list(build(world.tenant.pk))
    assert [row["id"] for row in rows] == [tool.pk for tool in expected]
    for row, tool in zip(rows, expected, strict=True):
        assert {f.attname for f in Tool._meta.concrete_fields} <= set(row)
        for name, value in row.items():
            if name == "double_id":
                assert value == tool.double_id
                continue
            parts = name.split("__")
            obj: Any = tool
            for part in parts[:-1]:
                obj = getattr(obj, part) if obj is not None else None
            assert value == (getattr(obj, parts[-1]) if obj is not None else None), name
    assert any(name.startswith("plugin_install__plugin__") for name in rows[0])


def test_an_integer_field_s_value_compiles_and_binds_as_django_binds_it(world: World) -> None:
    """Django binds an IntegerField's value as psycopg's Int4 (not a plain int): such a shape is compiled too (the
    events page was not, before), the value bound as Int4 again; a value past the column's range is the ORM's."""
    from agents.models import RunEvent

    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    run = Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input="x")
    for seq in range(1, 5):
        RunEvent.objects.create(tenant=world.tenant, run=run, seq=seq, step=0, type="t", span_id="a" * 16,
                                payload={}, at=timezone.now())

    def build(run_id: uuid.UUID, after: int) -> Any:
        return RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:3]

    read = CompiledRead(build)
    for after in (0, 2, 4, 2**31 - 1, 2**31, 10**30, -(2**31), -(2**31) - 1):
        assert [e.seq for e in read(run.pk, after)] == [e.seq for e in build(run.pk, after)], after
        rows = read.dicts(run.pk, after)
        if ON_POSTGRES and -(2**31) <= after < 2**31:
            assert rows is not None and [r["seq"] for r in rows] == [e.seq for e in build(run.pk, after)], after
        else:
            assert rows is None, after  # SQLite, or past Int4: the caller reads through the ORM
    if ON_POSTGRES:
        from psycopg.types.numeric import Int4

        (shape,) = read._shapes.values()
        assert shape is not None

        assert [p.wrap for p in shape.params if hasattr(p, "wrap")] == [None, Int4]

"""Query-parameter filters through django-filter, with errors that say what was wrong and what is expected.

Each app declares a ``FilterSet`` (``tools/filters.py``, ``approvals/filters.py``, ``audit/filters.py``,
``agents/filters.py``); the viewsets use ``DjangoFilterBackend``, so the parameters are documented in the OpenAPI
schema, a bad value is a 400 naming the parameter, and the filters run on the already tenant-scoped queryset.
The field classes here give the messages: ``Must be one of a, b; got 'x'.``, ``Must be true or false; ...``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django_filters.rest_framework import DjangoFilterBackend

from core.numbers import whole_number

_TRUE, _FALSE = frozenset({"true", "1", "yes"}), frozenset({"false", "0", "no"})


def refused(message: str, **params: Any) -> ValidationError:
    """A field error whose user-given parts travel as params: django-filter formats ``message % params``, so a ``%``
    in a query value must never reach the template itself."""
    return ValidationError(message, params=params)


class OneOfField(forms.CharField):
    """One of ``values``; ``expected`` words them for the message when "one of a, b" says too little."""

    def __init__(self, *, values: Sequence[str], expected: str = "", **kwargs: Any) -> None:
        self.values = list(values)
        self.expected = expected or f"one of {', '.join(self.values)}"
        super().__init__(**kwargs)

    def clean(self, value: Any) -> Any:
        value = super().clean(value)
        if value and value not in self.values:
            raise refused("Must be %(expected)s; got %(got)s.", expected=self.expected, got=repr(value))
        return value


class TrueFalseField(forms.Field):
    def clean(self, value: Any) -> bool | None:
        if value in (None, ""):
            return None
        if str(value).lower() in _TRUE:
            return True
        if str(value).lower() in _FALSE:
            return False
        raise refused("Must be true or false; got %(got)s.", got=repr(value))


class IdField(forms.CharField):
    """A UUID; ``what`` names it in the message (``Must be a run id (a UUID); got 'x'.``)."""

    def __init__(self, *, what: str, **kwargs: Any) -> None:
        self.what = what
        super().__init__(**kwargs)

    def clean(self, value: Any) -> uuid.UUID | None:
        value = super().clean(value)
        if not value:
            return None
        try:
            return uuid.UUID(value)
        except ValueError:
            raise refused("Must be a %(what)s id (a UUID); got %(got)s.", what=self.what, got=repr(value)) from None


class MomentField(forms.CharField):
    """An ISO date-time or a date; a wrong form or an impossible value (``2020-13-45``) names the parameter."""

    def clean(self, value: Any) -> dt.datetime | dt.date | None:
        value = super().clean(value)
        if not value:
            return None
        message = "Must be an ISO date-time (2024-11-28T14:30:00Z) or a date (2024-11-28); got %(got)s."
        try:  # parse_* return None for a wrong form and raise ValueError for an impossible value
            parsed = parse_datetime(value) or parse_date(value)
        except ValueError as exc:
            raise refused(message + " (%(why)s)", got=repr(value), why=str(exc)) from None
        if parsed is None:
            raise refused(message, got=repr(value))
        # out of range (0001-01-01T00:00+05:00) is refused here, while the parameter's name is known
        if isinstance(parsed, dt.datetime):
            _aware(parsed)
        else:
            _aware(dt.datetime.combine(parsed, dt.time.min))
            if parsed < dt.date.max:
                _aware(dt.datetime.combine(parsed + dt.timedelta(days=1), dt.time.min))
        return parsed


def _aware(value: dt.datetime) -> dt.datetime:
    """In UTC (naive means the server's time zone); out of range (``0001-01-01T00:00+05:00``) is refused."""
    try:
        return (timezone.make_aware(value) if timezone.is_naive(value) else value).astimezone(dt.UTC)
    except (ValueError, OverflowError) as exc:
        raise refused("Out of range: %(why)s.", why=str(exc)) from None


class ListFilterBackend(DjangoFilterBackend):
    """Filters narrow lists only: ``/runs/<id>?needs_attention=false`` still finds the run, and an action on one
    object (cancel, approve, events) is never a 404 because of a list parameter.

    A list asked for with none of its filters' parameters (``/runs?limit=50``, the common case) is the queryset as it
    is, and is returned as it is: django-filter would deep-copy the filters, build a form class and its fields, and
    validate an empty form, per request, to the same result (issue #14: ≈ 3 % of a server's CPU under load). That
    holds because no filter here is required, has a default, or reads a parameter under another name (a multi-part
    widget's ``_min``/``_max``); :func:`parameters` refuses the shortcut for a filterset that has such a filter."""

    def filter_queryset(self, request: Any, queryset: Any, view: Any) -> Any:
        if getattr(view, "action", None) != "list":
            return queryset
        filterset_class = self.get_filterset_class(view, queryset)
        # only a declared class: for ``filterset_fields`` django-filter builds a new class per call, which would grow
        # the cache below by one entry per request
        if filterset_class is not None and filterset_class is getattr(view, "filterset_class", None):
            names = parameters(filterset_class)
            if names is not None and names.isdisjoint(request.query_params):
                return queryset
        return super().filter_queryset(request, queryset, view)


_PARAMETERS: dict[type, frozenset[str] | None] = {}


def parameters(filterset_class: type[django_filters.FilterSet]) -> frozenset[str] | None:
    """The query parameters a filterset reads, when each filter reads exactly its own name and does nothing without
    it; else None (the filterset must always run)."""
    if filterset_class not in _PARAMETERS:
        base = django_filters.FilterSet
        names: frozenset[str] | None = frozenset(filterset_class.base_filters)
        if filterset_class.filter_queryset is not base.filter_queryset or filterset_class.qs is not base.qs:
            names = None  # it may narrow the list whatever the parameters
        for filter_ in filterset_class.base_filters.values():
            widget = filter_.extra.get("widget") or filter_.field_class.widget  # a class or an instance
            widget_class = widget if isinstance(widget, type) else type(widget)
            if issubclass(widget_class, forms.MultiWidget) or filter_.extra.get("required") or "initial" in filter_.extra:
                names = None  # it reads other names, or something without its parameter
        _PARAMETERS[filterset_class] = names
    return _PARAMETERS[filterset_class]


class OneOf(django_filters.CharFilter):
    """``?status=pending``: one of ``values`` (pass ``values=[...]``)."""

    field_class = OneOfField


class TrueFalse(django_filters.BooleanFilter):
    """``?enabled=true`` (also 1, false, 0)."""

    field_class = TrueFalseField


class IdFilter(django_filters.CharFilter):
    """``?run=<uuid>`` (pass ``what="run"``)."""

    field_class = IdField


class Since(django_filters.CharFilter):
    """``?since=``: from this date-time on, or from the start of this date (inclusive)."""

    field_class = MomentField

    def filter(self, qs: Any, value: Any) -> Any:
        if value in (None, ""):
            return qs
        start = value if isinstance(value, dt.datetime) else dt.datetime.combine(value, dt.time.min)
        return qs.filter(**{f"{self.field_name}__gte": _aware(start)})


class Until(django_filters.CharFilter):
    """``?until=``: up to this date-time, or to the end of this date (inclusive)."""

    field_class = MomentField

    def filter(self, qs: Any, value: Any) -> Any:
        if value in (None, ""):
            return qs
        if isinstance(value, dt.datetime):
            return qs.filter(**{f"{self.field_name}__lte": _aware(value)})
        if value >= dt.date.max:
            return qs
        end = dt.datetime.combine(value + dt.timedelta(days=1), dt.time.min)  # before the next day starts
        return qs.filter(**{f"{self.field_name}__lt": _aware(end)})


MAX_ID = 2**63 - 1  # the largest id a database row can have (bigint)


class IdNumberField(forms.CharField):
    """A row's numeric id (``?agent=12``): ASCII digits, at most a bigint."""

    def clean(self, value: Any) -> int | None:
        value = super().clean(value)
        if not value:
            return None
        number = whole_number(value)
        if number is None or number > MAX_ID:
            raise refused("Must be a number (an id); got %(got)s.", got=repr(value))
        return number


class DayField(forms.CharField):
    """A calendar day, ``YYYY-MM-DD``."""

    def clean(self, value: Any) -> dt.date | None:
        value = super().clean(value)
        if not value:
            return None
        try:
            day = dt.date.fromisoformat(value)
        except ValueError:
            raise refused("Must be a date as YYYY-MM-DD; got %(got)s.", got=repr(value)) from None
        if day >= dt.date.max:  # the day after it cannot be computed
            raise refused("Must be a date before 9999-12-31; got %(got)s.", got=repr(value))
        return day


class IdNumber(django_filters.CharFilter):
    """``?agent=12``: rows pointing at this id."""

    field_class = IdNumberField

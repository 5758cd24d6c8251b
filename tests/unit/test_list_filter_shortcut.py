"""Issue #14: a list asked for without any of its filters' parameters skips django-filter (core/filters.py
``ListFilterBackend``) — and gets exactly what the filterset would have given; with a parameter the filterset runs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import django_filters
import pytest
from django.http import QueryDict

from agents.api import RunViewSet
from agents.models import Run
from agents.session_api import SessionViewSet
from approvals.api import ApprovalViewSet
from audit.api import ConfigChangeViewSet, ToolCallAuditViewSet
from core.filters import ListFilterBackend, parameters
from tools.api import ToolViewSet

VIEWSETS = [RunViewSet, SessionViewSet, ApprovalViewSet, ToolCallAuditViewSet, ConfigChangeViewSet]


def listing(viewset: Any, query: str, action: str = "list") -> tuple[Any, Any]:
    view = SimpleNamespace(action=action, filterset_class=viewset.filterset_class)
    request = SimpleNamespace(query_params=QueryDict(query))
    return view, request


@pytest.mark.parametrize("viewset", VIEWSETS, ids=lambda v: v.__name__)
def test_without_its_parameters_a_list_is_what_the_filterset_gives_without_building_it(
        viewset: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    queryset = viewset.filterset_class._meta.model.objects.all()
    expected = str(viewset.filterset_class(data=QueryDict(), queryset=queryset).qs.query)
    assert parameters(viewset.filterset_class) == frozenset(viewset.filterset_class.base_filters)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the filterset was built")

    monkeypatch.setattr(django_filters.FilterSet, "__init__", refuse)
    view, request = listing(viewset, "limit=50&cursor=abc&ordering=x")  # pagination's parameters, not filters'
    filtered = ListFilterBackend().filter_queryset(request, queryset, view)
    assert filtered is queryset
    assert str(filtered.query) == expected


def test_with_a_parameter_the_filterset_runs_even_an_empty_one() -> None:
    queryset = Run.objects.all()
    backend = ListFilterBackend()
    view, request = listing(RunViewSet, "playground=true&limit=5")
    narrowed = backend.filter_queryset(request, queryset, view)
    assert narrowed is not queryset and '"playground"' in str(narrowed.query)
    view, request = listing(RunViewSet, "playground=")
    empty = backend.filter_queryset(request, queryset, view)
    assert empty is not queryset and str(empty.query) == str(queryset.query)  # ran, and narrowed nothing
    from rest_framework.exceptions import ValidationError

    view, request = listing(RunViewSet, "playground=perhaps")
    with pytest.raises(ValidationError) as caught:
        backend.filter_queryset(request, queryset, view)
    assert "Must be true or false; got 'perhaps'." in str(caught.value.detail)


def test_tools_filter_reads_its_own_names() -> None:
    assert parameters(ToolViewSet.filterset_class) == {"kind", "enabled"}


def test_a_filterset_that_reads_other_names_or_acts_without_its_parameter_always_runs() -> None:
    class Range(django_filters.FilterSet):  # ?step_min= / ?step_max=: names that are not the filter's
        step = django_filters.RangeFilter()

        class Meta:
            model = Run
            fields = ["step"]

    class Required(django_filters.FilterSet):
        status = django_filters.CharFilter(required=True)

        class Meta:
            model = Run
            fields = ["status"]

    class Narrows(django_filters.FilterSet):
        status = django_filters.CharFilter()

        class Meta:
            model = Run
            fields = ["status"]

        def filter_queryset(self, queryset: Any) -> Any:
            return super().filter_queryset(queryset).filter(playground=False)

    assert parameters(Range) is None
    assert parameters(Required) is None
    assert parameters(Narrows) is None
    view = SimpleNamespace(action="list", filterset_class=Narrows)
    request = SimpleNamespace(query_params=QueryDict("limit=5"))
    narrowed = ListFilterBackend().filter_queryset(request, Run.objects.all(), view)
    assert '"playground"' in str(narrowed.query)


def test_an_action_on_one_object_is_never_filtered() -> None:
    queryset = Run.objects.all()
    view, request = listing(RunViewSet, "playground=perhaps", action="retrieve")
    assert ListFilterBackend().filter_queryset(request, queryset, view) is queryset


def test_a_view_with_filterset_fields_is_filtered_and_grows_no_cache() -> None:
    """django-filter builds a new filterset class per call for ``filterset_fields``: caching per class would grow by
    one entry a request, so such a view takes django-filter's path, and still filters."""
    from core import filters

    queryset = Run.objects.all()
    view = SimpleNamespace(action="list", filterset_fields=["status"])
    backend = ListFilterBackend()
    before = len(filters._PARAMETERS)
    for _ in range(3):
        unfiltered = backend.filter_queryset(SimpleNamespace(query_params=QueryDict("limit=5")), queryset, view)
        assert str(unfiltered.query) == str(queryset.query)
    narrowed = backend.filter_queryset(SimpleNamespace(query_params=QueryDict("status=running")), queryset, view)
    assert '"status"' in str(narrowed.query)
    assert len(filters._PARAMETERS) == before

"""The admin's side of the one scoping gate: non-superusers see and pick only their tenants' rows.

Every choice the admin offers goes through here: foreign-key and many-to-many dropdowns (raw-id and
autocomplete widgets validate against the same querysets), autocomplete searches and list filters. A
user is offered only their tenants' rows, and only people who are members of their tenants.
"""

from __future__ import annotations

import logging
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import get_fields_from_path
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import models
from django.http import HttpRequest, HttpResponseRedirect

from core.errors import DomainError
from core.parsers import BoundedJSONField
from tenants.models import Membership
from tenants.scoping import Actor, actor_for_user

log = logging.getLogger(__name__)

#: Set on a request whose save a service refused after the form validated: the form is shown again with the refusal.
REFUSAL_ATTR = "_admin_service_refusal"


def scoped_choices(model: type[models.Model], actor: Actor, action: str, queryset: Any = None) -> Any:
    """The rows of ``model`` an actor may pick or filter by (for ``action``); ``None`` if ``model`` is not the tenants' business.

    Tenant-owned rows go through ``for_actor``; people are the members of the actor's tenants (never
    another tenant's staff); anything else (the plugin catalog) is the same for everyone.
    """
    queryset = model._default_manager.all() if queryset is None else queryset
    if hasattr(queryset, "for_actor"):
        return queryset.for_actor(actor, action)
    if model is get_user_model():
        if actor.is_superuser:
            return queryset
        return queryset.filter(pk__in=Membership.objects.for_actor(actor, action).values("user_id"))
    return None


class TenantScopedRelatedFilter(admin.RelatedFieldListFilter):
    """A related-field filter whose choices are the related rows of the rows the user may see (in their tenants)."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> Any:
        actor = actor_for_user(request.user)
        if actor.is_superuser:
            return super().field_choices(field, request, model_admin)
        used = model_admin.get_queryset(request).order_by().values(f"{self.field_path}__pk")
        allowed = scoped_choices(field.related_model, actor, getattr(model_admin, "view_action", "view"))
        pks = used if allowed is None else allowed.filter(pk__in=used).order_by().values("pk")
        ordering = self.field_admin_ordering(field, request, model_admin)
        return field.get_choices(include_blank=False, limit_choices_to={"pk__in": pks}, ordering=ordering)


class TenantScopedValuesFilter(admin.AllValuesFieldListFilter):
    """A filter on a value reached through a relation (``run__agent__slug``): values of the rows the user may see only.

    Django's own takes the values from every row of the related table, whichever tenant it belongs to.
    """

    def __init__(self, field: Any, request: HttpRequest, params: Any, model: Any, model_admin: Any, field_path: str) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        if not actor_for_user(request.user).is_superuser:
            visible = model_admin.get_queryset(request).exclude(**{f"{field_path}__isnull": True})
            self.lookup_choices = visible.distinct().order_by(field_path).values_list(field_path, flat=True)


def scoped_list_filter(model: type[models.Model], item: Any) -> Any:
    """``item`` of a ``list_filter``, with Django's filters that list other tenants' rows swapped for scoped ones."""
    if isinstance(item, (list, tuple)):
        path, kind = item[0], item[1]
        swaps = {admin.RelatedFieldListFilter: TenantScopedRelatedFilter, admin.AllValuesFieldListFilter: TenantScopedValuesFilter}
        return (path, swaps.get(kind, kind), *item[2:])
    if not isinstance(item, str):
        return item  # a SimpleListFilter: its own lookups
    fields = get_fields_from_path(model, item)
    last = fields[-1]
    if last.is_relation:
        return (item, TenantScopedRelatedFilter)
    if len(fields) > 1 and not last.flatchoices and not isinstance(last, (models.BooleanField, models.DateField)):
        return (item, TenantScopedValuesFilter)
    return item  # the model's own field: Django takes its values from this admin's (scoped) queryset


class ScopedChoicesMixin:
    """Foreign-key and many-to-many choices from the tenants where the user may ``manage_action``.

    For model admins and inlines alike; a choice outside them fails validation ("Select a valid choice").
    """

    manage_action = "operate"

    def _actor(self, request: HttpRequest) -> Actor:
        return actor_for_user(request.user)

    def _scoped_field_kwargs(self, db_field: Any, request: HttpRequest, kwargs: dict[str, Any]) -> dict[str, Any]:
        base = kwargs.get("queryset")
        if base is None:  # the related admin's ordering, as Django would use
            base = self.get_field_queryset(kwargs.get("using"), db_field, request)  # type: ignore[attr-defined]
        choices = scoped_choices(db_field.related_model, self._actor(request), self.manage_action, base)
        if choices is not None:
            kwargs["queryset"] = choices
        return kwargs

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        kwargs = self._scoped_field_kwargs(db_field, request, kwargs)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)  # type: ignore[misc]

    def formfield_for_manytomany(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        kwargs = self._scoped_field_kwargs(db_field, request, kwargs)
        return super().formfield_for_manytomany(db_field, request, **kwargs)  # type: ignore[misc]


class SameTenantForm(forms.ModelForm):
    """A row and what it points to belong to one tenant: a user of two tenants cannot link one to the other's rows."""

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        tenant = data.get("tenant") if "tenant" in data else getattr(self.instance, "tenant", None)
        if tenant is None:
            return data
        for name, value in list(data.items()):
            other = getattr(value, "tenant_id", None)
            if name != "tenant" and isinstance(value, models.Model) and other is not None and other != tenant.pk:
                self.add_error(name, f"{value} belongs to another tenant; choose one of {tenant}'s.")
        return data


class TenantScopedAdmin(ScopedChoicesMixin, admin.ModelAdmin):
    """Rows are filtered to the user's tenants; what they may do follows their role there.

    ``manage_action`` is the tenant action needed to add/change/delete (``own`` for members and keys).
    ``read_only`` makes the model read-only for everyone (audit, events).
    ``author_field`` names who made a row: read-only in the form, the requesting user when it is added.
    """

    view_action = "view"
    read_only = False
    author_field: str | None = None
    #: JSON typed into a form is bounded like an API body (nesting, lone surrogates, NaN): a form error, not a 500.
    formfield_overrides = {models.JSONField: {"form_class": BoundedJSONField}}
    #: A search longer than this is cut to it (a 100,000-character LIKE pattern is refused by SQLite, and costs
    #: PostgreSQL a scan for nothing a person types).
    max_search_chars = 200

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """A list filter whose value the database cannot take (``?created_at__year=99999``) is an invalid lookup: the
        admin's own answer (back to the list with ``?e=1``) instead of a 500."""
        try:
            return super().get_changelist_instance(request)
        except (ValueError, OverflowError) as exc:
            log.info("admin list %s: a filter the database cannot take (%s): %s", self.model._meta.label,
                     request.GET.urlencode()[:200], exc)
            raise IncorrectLookupParameters(str(exc)) from None


    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).for_actor(self._actor(request), self.view_action)

    def has_module_permission(self, request: HttpRequest) -> bool:
        actor = self._actor(request)
        return actor.is_superuser or bool(actor.roles)

    def _allowed(self, request: HttpRequest, kind: str, obj: Any = None) -> bool:
        if self.read_only and kind != "view":
            return False
        actor = self._actor(request)
        needed = self.manage_action if kind != "view" else self.view_action
        if obj is not None:
            tenant_id = getattr(obj, "tenant_id", None)
            return (tenant_id is None and actor.is_superuser) or (tenant_id is not None and actor.can(needed, tenant_id))
        ids = actor.tenant_ids(needed)
        return ids is None or bool(ids)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, "view", obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, "change", obj)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, "add")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, "delete", obj)

    def get_list_filter(self, request: HttpRequest) -> Any:
        return [scoped_list_filter(self.model, item) for item in super().get_list_filter(request)]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        if self.author_field and self.author_field not in fields:
            fields.append(self.author_field)
        return fields

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        if not issubclass(form, SameTenantForm):
            form = type(form.__name__, (SameTenantForm, form), {})
        refusal = getattr(request, REFUSAL_ATTR, None)
        if refusal is None:
            return form

        class RefusedForm(form):  # type: ignore[valid-type,misc]
            def clean(self) -> Any:
                cleaned = super().clean()
                self.add_error(refusal.field if refusal.field in self.fields else None, f"Not saved: {refusal.message}")
                return cleaned

        return RefusedForm

    def save_form(self, request: HttpRequest, form: Any, change: bool) -> Any:
        obj = super().save_form(request, form, change)
        if self.author_field and not change:
            setattr(obj, self.author_field, request.user)
        return obj

    # A service's refusal that got past the form (a race, a rule the form cannot see): the change is rolled back
    # (Django runs these views in a transaction) and the page says why, never a 500. On a form the same POST is
    # shown again with the refusal as the form's error, so nothing the user typed is lost.
    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().changeform_view(request, *args, **kwargs)
        except (DomainError, ValidationError) as exc:
            if isinstance(exc, ValidationError):  # a model's clean() in the service: the same refusal, in Django's words
                exc = DomainError("; ".join(exc.messages))
            if request.method != "POST" or getattr(request, REFUSAL_ATTR, None) is not None:
                self.message_user(request, f"Not saved: {exc.message}", messages.ERROR)
                return HttpResponseRedirect(request.get_full_path())
            setattr(request, REFUSAL_ATTR, exc)
            return super().changeform_view(request, *args, **kwargs)

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return self._refusals_as_messages(request, super().delete_view, request, *args, **kwargs)

    def changelist_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:  # actions, bulk delete
        return self._refusals_as_messages(request, super().changelist_view, request, *args, **kwargs)

    def _refusals_as_messages(self, request: HttpRequest, view: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return view(*args, **kwargs)
        except DomainError as exc:
            self.message_user(request, f"Not saved: {exc.message}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> tuple[Any, bool]:
        """An autocomplete offers what the asking field may hold: rows of tenants where its admin may manage. A search
        longer than ``max_search_chars`` is cut to it."""
        if len(search_term) > self.max_search_chars:
            messages.warning(request, f"The search was cut to its first {self.max_search_chars} characters.")
            search_term = search_term[: self.max_search_chars]
        queryset, duplicates = super().get_search_results(request, queryset, search_term)
        source = self._autocomplete_source(request)
        if source is not None and hasattr(queryset, "for_actor"):
            queryset = queryset.for_actor(self._actor(request), getattr(source, "manage_action", self.view_action))
        return queryset, duplicates

    def _autocomplete_source(self, request: HttpRequest) -> Any:
        match = getattr(request, "resolver_match", None)
        if match is None or match.url_name != "autocomplete":
            return None
        for model, model_admin in self.admin_site._registry.items():
            if (model._meta.app_label, model._meta.model_name) == (request.GET.get("app_label"), request.GET.get("model_name")):
                return model_admin
        return self  # asked from an inline or an unregistered model: hold it to this admin's own rules


class TenantScopedInline(ScopedChoicesMixin):
    """For inlines (``class X(TenantScopedInline, admin.TabularInline)``): the same choices as their admin."""

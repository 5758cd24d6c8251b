"""The release-weights inline of the agent admin (imported by ``agents/admin.py``).

Saving goes through ``marketplace.services.set_release_weights`` (validated, audited), never the ORM.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest

from agents.models import AgentVersion
from marketplace import services
from marketplace.models import ReleaseWeight
from marketplace.release import observed_split, weight_errors
from tenants.admin_mixins import TenantScopedInline
from tenants.scoping import actor_for_user

OBSERVED_WINDOW = 200


class ReleaseWeightFormSet(BaseInlineFormSet):
    request: HttpRequest | None = None

    def add_fields(self, form: forms.Form, index: Any) -> None:
        super().add_fields(form, index)
        if "version" in form.fields:  # only this agent's versions (and so only this tenant's)
            agent_id = self.instance.pk
            form.fields["version"].queryset = (AgentVersion.objects.filter(agent_id=agent_id) if agent_id
                                               else AgentVersion.objects.none())

    def _weights(self) -> dict[AgentVersion, int]:
        weights: dict[AgentVersion, int] = {}
        for form in self.forms:
            data = getattr(form, "cleaned_data", None) or {}
            if not data or data.get("DELETE") or data.get("version") is None:
                continue
            if data["version"] in weights:
                raise forms.ValidationError(f"v{data['version'].number} is listed twice; give each version one weight.")
            weights[data["version"]] = data.get("weight") or 0
        return weights

    def clean(self) -> None:
        super().clean()
        if any(self.errors) or not self.has_changed():
            return
        weights = self._weights()
        errors = weight_errors({v.number: w for v, w in weights.items()},
                               known_numbers=[v.number for v in weights], agent_slug=self.instance.slug)
        if weights and not errors and self.instance.current_version_id is None:
            errors.append("Set the agent's current (stable) version before giving versions weights.")
        if errors:
            raise forms.ValidationError(errors)
        if self.request is not None:
            # the release gate, checked here so that its refusal is a form error and its audit row is kept
            try:
                services.check_release_gate(agent=self.instance, weights=weights, actor=actor_for_user(self.request.user))
            except services.GateRefused as exc:
                raise forms.ValidationError(str(exc)) from None

    def save(self, commit: bool = True) -> list[Any]:
        self.new_objects, self.changed_objects, self.deleted_objects = [], [], []
        if self.has_changed():
            if self.request is None:  # set by the inline's get_formset: never save as the platform by accident
                raise RuntimeError("ReleaseWeightFormSet.request is not set")
            services.set_release_weights(agent=self.instance, weights=self._weights(), actor=actor_for_user(self.request.user))
        return []


class ReleaseWeightInline(TenantScopedInline, admin.TabularInline):
    model = ReleaseWeight
    formset = ReleaseWeightFormSet
    extra = 0
    fields = ["version", "weight", "observed", "live_since"]
    readonly_fields = ["observed", "live_since"]
    verbose_name = "release weight"
    verbose_name_plural = f"Gray release: weights over versions (must add up to 100), beside the split of the last {OBSERVED_WINDOW} runs"

    # Inlines follow the same role rules as TenantScopedAdmin: ``obj`` is the agent being edited.
    def _may(self, request: HttpRequest, action: str, obj: Any) -> bool:
        actor = actor_for_user(request.user)
        if obj is None:
            ids = actor.tenant_ids(action)
            return ids is None or bool(ids)
        return actor.can(action, obj.tenant_id)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may(request, "view", obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may(request, "operate", obj)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may(request, "operate", obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may(request, "operate", obj)

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        formset = super().get_formset(request, obj, **kwargs)
        return type("BoundReleaseWeightFormSet", (formset,), {"request": request})

    @admin.display(description=f"observed (last {OBSERVED_WINDOW} runs)")
    def observed(self, obj: ReleaseWeight) -> str:
        if obj.pk is None:
            return "-"
        runs, percent = observed_split(obj.agent, last=OBSERVED_WINDOW).get(obj.version.number, (0, 0.0))
        return f"{percent:.1f}% ({runs} runs)"

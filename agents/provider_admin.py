"""Admin for model providers. The key and header values are write-only; changes go through the services."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from agents import provider_services as services
from agents.models import Provider
from agents.providers import check_api_key, check_fields, check_headers, granted_secrets, key_status, masked_headers
from core.remote_waits import RemoteCallsBusy
from tenants.admin_mixins import TenantScopedAdmin
from tenants.scoping import actor_for_user


class ProviderForm(forms.ModelForm):
    api_key = forms.CharField(
        required=False, strip=True, widget=forms.PasswordInput(render_value=False),
        help_text="Leave empty to keep the current key. Paste a key (stored encrypted). A shared provider (or a tenant "
                  "granted the secret) may write secret:NAME to read the environment variable PROVIDER_SECRET_NAME.",
    )
    clear_api_key = forms.BooleanField(required=False, help_text="Remove the stored key.")
    default_headers = forms.JSONField(
        required=False,
        help_text='Leave empty to keep the current headers; {} removes them. e.g. {"OpenAI-Organization": "org-123"}. '
                  "Values are stored encrypted and never shown; like the key, a value may be secret:NAME.",
    )

    class Meta:
        model = Provider
        fields = ["tenant", "name", "kind", "base_url", "timeout", "max_retries", "offered_models",
                  "requests_per_minute", "tokens_per_minute", "enabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["default_headers"].initial = None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not data.get("tenant") and not getattr(self, "superuser", False):
            self.add_error("tenant", "Choose a tenant: only superusers may create shared providers.")
        values = {f: data[f] for f in services.FIELDS if f in data}
        for field, problems in check_fields(values).items():
            self.add_error("offered_models" if field == "models" else field, problems)
        # The row's tenant decides which secret references it may hold (an existing row keeps its tenant).
        tenant = self.instance.tenant if self.instance.pk else data.get("tenant")
        scope = {"platform": tenant is None, "granted": granted_secrets(tenant)}
        if data.get("api_key"):
            for problem in check_api_key(data["api_key"], **scope):
                self.add_error("api_key", problem)
        if data.get("default_headers") is not None:
            for problem in check_headers(data["default_headers"], **scope):
                self.add_error("default_headers", problem)
        return data

    def secrets(self) -> dict[str, Any]:
        data = self.cleaned_data
        found: dict[str, Any] = {}
        if data.get("clear_api_key"):
            found["api_key"] = ""
        elif data.get("api_key"):
            found["api_key"] = data["api_key"]
        if data.get("default_headers") is not None:
            found["default_headers"] = data["default_headers"]
        return found


@admin.action(description="Test connection")
def test_connection(modeladmin: ProviderAdmin, request: HttpRequest, queryset: QuerySet[Provider]) -> None:
    actor = actor_for_user(request.user)
    for provider in queryset:
        try:
            check = services.check_connection(actor=actor, provider=provider)
        except (services.ProviderRefused, RemoteCallsBusy) as exc:
            modeladmin.message_user(request, f"{provider.name}: {exc}", messages.ERROR)
            continue
        level = messages.SUCCESS if check.ok else messages.ERROR
        modeladmin.message_user(request, f"{provider.name}: {check.message}", level)


@admin.register(Provider)
class ProviderAdmin(TenantScopedAdmin):
    form = ProviderForm
    list_display = ["name", "tenant_or_shared", "kind", "base_url", "api_key_state", "enabled", "updated_at"]
    list_filter = ["kind", "enabled", "tenant"]
    list_select_related = ["tenant"]
    search_fields = ["name", "base_url"]
    readonly_fields = ["api_key_state", "headers_state", "created_at", "updated_at"]
    actions = [test_connection]
    fieldsets = [
        (None, {"fields": ["tenant", "name", "kind", "base_url", "enabled"]}),
        ("Credentials (write-only)", {"fields": ["api_key_state", "api_key", "clear_api_key", "headers_state", "default_headers"]}),
        ("Models and limits", {"fields": ["offered_models", "timeout", "max_retries", "requests_per_minute", "tokens_per_minute"]}),
        ("History", {"fields": ["created_at", "updated_at"]}),
    ]

    @admin.display(description="tenant")
    def tenant_or_shared(self, provider: Provider) -> str:
        return str(provider.tenant) if provider.tenant_id else "shared (all tenants)"

    @admin.display(description="API key")
    def api_key_state(self, provider: Provider) -> str:
        return key_status(provider)

    @admin.display(description="default headers")
    def headers_state(self, provider: Provider) -> str:
        shown = masked_headers(provider)
        return ", ".join(f"{name}: {value}" for name, value in shown.items()) or "none"

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        form.superuser = bool(getattr(request.user, "is_superuser", False))
        return form

    def save_model(self, request: HttpRequest, obj: Provider, form: Any, change: bool) -> None:
        actor = actor_for_user(request.user)
        values = {f: form.cleaned_data[f] for f in services.FIELDS if f in form.cleaned_data}
        if change:
            saved = services.update_provider(actor=actor, provider=obj, values=values, **form.secrets())
        else:
            saved = services.create_provider(actor=actor, tenant=form.cleaned_data.get("tenant"), values=values, **form.secrets())
        obj.pk = saved.pk
        obj.refresh_from_db()

    def delete_model(self, request: HttpRequest, obj: Provider) -> None:
        services.delete_provider(actor=actor_for_user(request.user), provider=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Provider]) -> None:
        actor = actor_for_user(request.user)
        for provider in queryset:
            services.delete_provider(actor=actor, provider=provider)

"""Admin for the approval queue: filters, and approve/reject actions through the same service and rules."""

from __future__ import annotations

import json
from contextlib import ExitStack, suppress
from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from approvals import channels, decisions, edits
from approvals.models import ApprovalRequest, Delivery, NotificationChannel, NotifyEvent
from core.numbers import whole_number
from core.parsers import BoundedJSONField
from core.remote_waits import RemoteCallsBusy
from tenants.admin_mixins import TenantScopedAdmin
from tenants.scoping import actor_for_user


class AgeFilter(admin.SimpleListFilter):
    title = "age"
    parameter_name = "age"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("5m", "older than 5 minutes"), ("1h", "older than 1 hour"), ("1d", "older than 1 day")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        from django.utils import timezone

        spans = {"5m": 300, "1h": 3600, "1d": 86400}
        if self.value() in spans:
            return queryset.filter(requested_at__lt=timezone.now() - timezone.timedelta(seconds=spans[self.value()]))
        return queryset


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(TenantScopedAdmin):
    read_only = True
    view_action = "review"  # viewers do not see approval requests
    list_display = ["requested_at", "tool_name", "status", "agent_slug", "run", "expires_at", "tenant", "edit_link"]
    list_filter = ["status", "tool_name", "run__agent__slug", AgeFilter, "tenant"]
    list_select_related = ["run", "run__agent", "tenant"]
    search_fields = ["tool_name", "run__id"]
    actions = ["approve_selected", "reject_selected"]

    @admin.display(description="agent", ordering="run__agent__slug")
    def agent_slug(self, obj: ApprovalRequest) -> str:
        return obj.run.agent.slug

    @admin.display(description="edit")
    def edit_link(self, obj: ApprovalRequest) -> str:
        if obj.status != "pending":
            return ""
        return format_html('<a href="{}">approve with edits</a>', reverse("admin:approvals_approvalrequest_edit", args=[obj.pk]))

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view(self.approve_with_edits)
        return [path("<uuid:object_id>/approve-with-edits/", view, name="approvals_approvalrequest_edit"), *super().get_urls()]

    def approve_with_edits(self, request: HttpRequest, object_id: Any) -> HttpResponse:
        """Edit a pending call's arguments (a JSON object of the fields to change) and approve: the same service."""
        item = self.get_queryset(request).select_related("tool", "run__version").filter(pk=object_id).first()
        if item is None or not self.has_view_permission(request, item):
            raise Http404("No such approval request.")
        form = ApproveWithEditsForm(request.POST or None, initial={"arguments_hash": item.current_hash})
        if request.method == "POST" and form.is_valid():
            try:
                decisions.decide(actor=actor_for_user(request.user), request_id=item.pk, approve=True, via="admin",
                                 note=form.cleaned_data["note"], arguments=form.cleaned_data["arguments"],
                                 seen_hash=form.cleaned_data["arguments_hash"])
            except edits.EditInvalid as exc:
                for problem in exc.problems:
                    form.add_error("arguments", problem)
            except decisions.ApprovalRefused as exc:
                form.add_error(None, str(exc))
            else:
                self.message_user(request, "Approved with your edits.")
                return redirect("admin:approvals_approvalrequest_changelist")
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "item": item, "form": form,
                   "title": f"Approve {item.tool_name} with edits",
                   "shown": json.dumps((item.preview or {}).get("arguments") or {}, indent=1, ensure_ascii=False)}
        return TemplateResponse(request, "admin/approvals/approve_with_edits.html", context,
                                status=400 if request.method == "POST" else 200)

    def _decide(self, request: HttpRequest, queryset: Any, approve: bool) -> None:
        actor = actor_for_user(request.user)
        done = 0
        for item in queryset:
            try:
                decisions.decide(actor=actor, request_id=item.pk, approve=approve, note="decided in the admin", via="admin")
                done += 1
            except decisions.ApprovalRefused as exc:
                self.message_user(request, f"{item}: {exc}", messages.WARNING)
        self.message_user(request, f"{'Approved' if approve else 'Rejected'} {done} request(s).")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Approve selected requests")
    def approve_selected(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, True)

    @admin.action(description="Reject selected requests")
    def reject_selected(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, False)


class ApproveWithEditsForm(forms.Form):
    arguments = BoundedJSONField(help_text='The fields to change, e.g. {"amount": "30.00"}; the others keep their values.')
    note = forms.CharField(required=False, max_length=2000)
    arguments_hash = forms.CharField(required=False, widget=forms.HiddenInput)


class ChannelForm(forms.ModelForm):
    secret = forms.CharField(
        required=False, strip=True, widget=forms.PasswordInput(render_value=False),
        help_text="secret:NAME of a signing secret granted to the tenant (NOTIFY_SECRET_NAME). Never shown; leave empty to keep "
                  "the current one.")
    clear_secret = forms.BooleanField(required=False, help_text="Remove the signing secret.")
    events = forms.MultipleChoiceField(choices=NotifyEvent.choices, widget=forms.CheckboxSelectMultiple)

    class Meta:
        model = NotificationChannel
        fields = ["tenant", "name", "kind", "target", "events", "tools", "enabled"]
        help_texts = {"target": "The webhook URL, shown masked (it is a credential): leave it as shown to keep it, or "
                                "type a new one. Empty for email."}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk and "target" in self.fields:  # the service keeps the stored URL when this comes back
            self.initial["target"] = channels.shown_target(self.instance.target)


@admin.register(NotificationChannel)
class NotificationChannelAdmin(TenantScopedAdmin):
    """Channels are saved by ``approvals.channels``: the API's validation, the egress guard and the audit row."""

    form = ChannelForm
    list_display = ["name", "tenant", "kind", "target_host", "events", "enabled", "secret_state"]
    list_filter = ["tenant", "kind", "enabled"]
    list_select_related = ["tenant"]
    search_fields = ["name"]
    filter_horizontal = ["tools"]

    @admin.display(description="target host")
    def target_host(self, obj: NotificationChannel) -> str:
        return urlsplit(obj.target).hostname or "(the approvers' email)"

    @admin.display(description="signing secret")
    def secret_state(self, obj: NotificationChannel) -> str:
        return channels.secret_status(obj)

    @admin.display(description="target")
    def shown_target(self, obj: NotificationChannel) -> str:
        return channels.shown_target(obj.target) or "(the approvers' email)"

    def _view_only(self, request: HttpRequest, obj: Any) -> bool:
        return obj is not None and not self.has_change_permission(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return []
        return ["tenant", "shown_target"] if self._view_only(request, obj) else ["tenant"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """A reader who may not change the channel sees its URL masked (Django would show the stored value)."""
        fields = list(super().get_fields(request, obj))
        if self._view_only(request, obj):
            fields = [f for f in fields if f not in ("target", "secret", "clear_secret")]
        return fields

    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
                        extra_context: Any = None) -> Any:
        """A posted webhook address is resolved before Django opens the form's transaction, holding no database
        connection (the tenant's DNS may be slow); the service then uses that answer (``channels.addresses_checked``)."""
        with ExitStack() as ahead:
            tenant_id = self._posted_tenant(request, object_id) if request.method == "POST" else None
            if tenant_id is not None:
                with suppress(RemoteCallsBusy):  # the service meets the same refusal, which the form shows
                    ahead.enter_context(channels.addresses_checked(tenant_id, request.POST.get("kind"),
                                                                   request.POST.get("target")))
            return super().changeform_view(request, object_id, form_url, extra_context)

    def _posted_tenant(self, request: HttpRequest, object_id: str | None) -> int | None:
        """The tenant of the channel being saved, when the user may change its channels; else None (nothing ahead)."""
        if object_id is not None:
            channel = self.get_object(request, unquote(object_id))
            tenant_id = channel.tenant_id if channel is not None else None
        else:
            tenant_id = whole_number(request.POST.get("tenant", ""))
        return tenant_id if tenant_id is not None and self._actor(request).can("operate", tenant_id) else None

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        actor = self._actor(request)
        data = form.cleaned_data
        values = {f: data[f] for f in ("name", "kind", "target", "events", "enabled") if f in data}
        secret: Any = "" if data.get("clear_secret") else (data.get("secret") or channels.KEEP)
        tools = list(data.get("tools") or [])
        if change:
            saved = channels.update_channel(actor=actor, channel=obj, values=values, secret=secret, tools=tools)
        else:
            saved = channels.create_channel(actor=actor, tenant=data["tenant"], values=values, secret=secret, tools=tools)
        obj.pk = saved.pk
        obj._state.adding = False

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """The service set the tools already (scoped to the channel's tenant); nothing is saved past it."""

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        channels.delete_channel(actor=self._actor(request), channel=obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for channel in queryset.select_related("tenant"):
            self.delete_model(request, channel)


@admin.register(Delivery)
class DeliveryAdmin(TenantScopedAdmin):
    """Every notification sent or tried: attempts, the last error and the answer's status code."""

    read_only = True
    view_action = "review"
    list_display = ["created_at", "event", "channel", "request", "status", "attempts", "response_code", "last_error_short",
                    "next_attempt_at", "tenant"]
    list_filter = ["status", "event", "channel__kind", "tenant"]
    list_select_related = ["channel", "request", "tenant"]
    readonly_fields = ["tenant", "channel", "request", "event", "status", "attempts", "response_code", "last_error",
                       "next_attempt_at", "created_at", "sent_at"]

    @admin.display(description="last error")
    def last_error_short(self, obj: Delivery) -> str:
        return obj.last_error[:120]

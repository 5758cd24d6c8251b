"""Admin for the approval queue: filters, and approve/reject actions through the same service and rules."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from approvals import decisions
from approvals.models import ApprovalRequest
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
    list_display = ["requested_at", "tool_name", "status", "agent_slug", "run", "expires_at", "tenant"]
    list_filter = ["status", "tool_name", "run__agent__slug", AgeFilter, "tenant"]
    list_select_related = ["run", "run__agent", "tenant"]
    search_fields = ["tool_name", "run__id"]
    actions = ["approve_selected", "reject_selected"]

    @admin.display(description="agent", ordering="run__agent__slug")
    def agent_slug(self, obj: ApprovalRequest) -> str:
        return obj.run.agent.slug

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

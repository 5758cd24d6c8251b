"""Release safety in the admin: evaluation sets with their frozen members, replay batches and their per-run results.

All read-only (a set is frozen when created; a batch's results are the replay's). Sets are created and replays
started through ``releases.services`` — the API, the console pages (console/release_pages.py) and the action here.
Tenant-scoped like every admin: a foreign tenant's set, batch or result is a 404.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from agents.admin import ReadOnlyAdmin
from core.errors import DomainError
from releases import diffs, services
from releases.models import EvaluationSet, EvaluationSetRun, ReplayBatch, ReplayRun
from tenants.admin_mixins import TenantScopedInline


class MemberInline(TenantScopedInline, admin.TabularInline):
    model = EvaluationSetRun
    fields = ["position", "run", "run_status", "run_terminal_reason"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    verbose_name = "member run (frozen)"
    verbose_name_plural = "member runs (frozen when the set was created)"

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("run")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:  # obj: the set being viewed
        actor = self._actor(request)
        if obj is None:
            ids = actor.tenant_ids("view")
            return ids is None or bool(ids)
        return actor.can("view", obj.tenant_id)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="status")
    def run_status(self, obj: EvaluationSetRun) -> str:
        return obj.run.status

    @admin.display(description="terminal reason")
    def run_terminal_reason(self, obj: EvaluationSetRun) -> str:
        return obj.run.terminal_reason or "-"


@admin.register(EvaluationSet)
class EvaluationSetAdmin(ReadOnlyAdmin):
    list_display = ["name", "agent", "runs", "tenant", "created_by", "created_at"]
    list_filter = ["tenant"]
    list_select_related = ["agent", "tenant", "created_by"]
    search_fields = ["name"]
    fields = ["name", "agent", "description", "chosen_by", "created_by", "created_at", "console"]
    readonly_fields = fields
    inlines = [MemberInline]
    actions = ["replay_current_version"]

    def get_queryset(self, request: HttpRequest) -> Any:
        from django.db.models import Count

        return super().get_queryset(request).annotate(member_count=Count("members"))

    @admin.display(description="runs", ordering="member_count")
    def runs(self, obj: Any) -> int:
        return getattr(obj, "member_count", 0)

    @admin.display(description="chosen by")
    def chosen_by(self, obj: EvaluationSet) -> str:
        return json.dumps(obj.filters, ensure_ascii=False, sort_keys=True)

    @admin.display(description="console page")
    def console(self, obj: EvaluationSet) -> Any:
        return format_html('<a href="{}">open the set in the console</a>', reverse("console:evaluation-set", args=[obj.pk]))

    @admin.action(description="Replay on the agent's current version (recorded mode, default checks)")
    def replay_current_version(self, request: HttpRequest, queryset: Any) -> None:
        actor = self._actor(request)
        for row in queryset.select_related("agent__current_version", "tenant"):
            try:
                if row.agent.current_version is None:
                    raise DomainError(f"{row.agent.slug!r} has no current version to replay.")
                batch = services.start_replay(tenant=row.tenant, actor=actor, evaluation_set=row,
                                              candidate=row.agent.current_version, model_mode="recorded")
            except DomainError as exc:
                self.message_user(request, f"{row.name}: not started: {exc.message}", messages.ERROR)
                continue
            self.message_user(request, f"{row.name}: replay {batch.pk} queued.")


@admin.register(ReplayBatch)
class ReplayBatchAdmin(ReadOnlyAdmin):
    list_display = ["id", "evaluation_set", "candidate", "model_mode", "status", "progress", "pass_rate", "cost_spent",
                    "tenant", "created_at"]
    list_filter = ["status", "model_mode", "tenant"]
    list_select_related = ["evaluation_set", "candidate__agent", "tenant"]
    fields = ["evaluation_set", "candidate", "model_mode", "miss_policy", "checks_text", "cost_cap", "concurrency", "status",
              "progress", "passed_count", "failed_count", "pass_rate", "cost_spent", "error", "created_by", "created_at",
              "started_at", "finished_at", "console"]
    readonly_fields = fields

    @admin.display(description="done")
    def progress(self, obj: ReplayBatch) -> str:
        return f"{obj.done} / {obj.total}"

    @admin.display(description="checks")
    def checks_text(self, obj: ReplayBatch) -> str:
        return json.dumps(obj.checks, ensure_ascii=False)

    @admin.display(description="console page")
    def console(self, obj: ReplayBatch) -> Any:
        return format_html('<a href="{}">the diff page</a>', reverse("console:replay-batch", args=[obj.pk]))


@admin.register(ReplayRun)
class ReplayRunAdmin(ReadOnlyAdmin):
    list_display = ["id", "batch", "source_run", "status", "passed", "regression", "changed", "tokens", "cost", "latency_ms",
                    "tenant"]
    list_filter = ["status", "passed", "regression", "tenant"]
    list_select_related = ["batch", "tenant"]
    fields = ["batch", "source_run", "position", "status", "passed", "regression", "changed", "checks_table", "diff_text",
              "live_tool_calls", "tokens", "cost", "latency_ms", "error"]
    readonly_fields = fields

    @admin.display(description="changed")
    def changed(self, obj: ReplayRun) -> str:
        return ", ".join((obj.diff or {}).get("changed", [])) or "-"

    @admin.display(description="checks")
    def checks_table(self, obj: ReplayRun) -> Any:
        return format_html_join("", "<div>{}: {}</div>", ((c.get("check"), "passed" if c.get("passed") else "FAILED")
                                                         for c in obj.check_results or []))

    @admin.display(description="diff")
    def diff_text(self, obj: ReplayRun) -> Any:
        """Masked as the reports are (releases.diffs.masked), whoever reads it."""
        shown = diffs.masked(obj.diff, services.sensitive_fields(obj.tenant_id, [obj.diff]))
        return format_html("<pre>{}</pre>", json.dumps(shown, indent=2, ensure_ascii=False, default=str))

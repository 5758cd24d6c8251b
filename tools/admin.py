from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from core.documents import DocumentWidget
from core.numbers import number_or_text
from runtime import approval_policy
from tenants.admin_mixins import TenantScopedAdmin
from tools import decisions, handlers, kinds, services
from tools.models import Tool
from tools.serializers import WRITABLE_FIELDS, ToolSerializer


@admin.register(Tool)
class ToolAdmin(TenantScopedAdmin):
    list_display = ["name", "tenant", "kind", "category", "requires_approval", "rate_limit_per_minute", "enabled", "plugin_install",
                    "updated_at"]
    list_filter = ["tenant", "kind", "category", "enabled", "requires_approval"]
    list_select_related = ["tenant", "plugin_install"]
    search_fields = ["name", "description"]
    actions = ["switch_off", "switch_on"]
    change_form_template = "admin/tools/tool/change_form.html"

    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
                        extra_context: Any = None) -> Any:
        if request.method == "POST" and object_id and "_preview_impact" in request.POST:
            return self._preview_impact(request, object_id)
        return super().changeform_view(request, object_id, form_url, extra_context)

    def _preview_impact(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The impact of the form's current, unsaved values on recorded calls (agents/shadow.py); saves nothing."""
        tool = self.get_object(request, object_id)
        if tool is None or not self.has_change_permission(request, tool):
            raise Http404("No such tool.")
        form = self.get_form(request, tool, change=True)(request.POST, request.FILES, instance=tool)
        errors: dict[str, list[str]] = {}
        impact: dict[str, Any] = {}
        if not form.is_valid():
            errors = {name: [str(p) for p in problems] for name, problems in form.errors.items()}
        elif handlers.agents.preview_tool_impact is None:
            errors = {"__all__": ["The impact preview is not available."]}
        else:
            fields = {f: form.cleaned_data[f] for f in decisions.PREVIEW_FIELDS if f in form.changed_data}
            raw_days = request.POST.get("_preview_days") or "7"
            try:
                impact = handlers.agents.preview_tool_impact(tool=Tool.objects.get(pk=tool.pk), actor=self._actor(request),
                                                             fields=fields, days=number_or_text(raw_days))
            except services.ToolRefused as exc:
                errors = {getattr(exc, "field", None) or "__all__": [exc.message]}
        rows = [(label, impact[key]) for label, key in (
            ("Newly denied", "newly_denied"), ("Newly needs approval", "newly_needs_approval"),
            ("Newly rate limited", "newly_rate_limited"), ("Newly allowed", "newly_allowed"))] if impact else []
        context = {**self.admin_site.each_context(request), "title": f"Impact of a change to {tool.name}", "tool": tool,
                   "impact": impact, "rows": rows, "errors": errors, "opts": self.model._meta, "back": request.path}
        return TemplateResponse(request, "admin/tools/tool/preview_impact.html", context, status=400 if errors else 200)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # The kill switch is flipped with the list actions (audited), and a plugin's link is the install's business.
        return ["enabled", "plugin_install", "created_at", "updated_at"] if obj is not None else ["plugin_install"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """The API's checks, field by field, as form errors: the admin accepts no tool definition the API refuses."""
        kwargs.setdefault("widgets", {})["approval_policy"] = DocumentWidget(approval_policy.ApprovalPolicy)
        base = super().get_form(request, obj, change, **kwargs)
        if "config" in base.base_fields:
            base.base_fields["config"].help_text = kinds.config_help()  # each kind's config document, in one line
        actor = self._actor(request)

        class CheckedToolForm(base):  # type: ignore[valid-type,misc]
            def _post_clean(self) -> None:
                super()._post_clean()
                if self.errors:
                    return
                current = Tool.objects.filter(pk=self.instance.pk).first()
                writable = [f for f in WRITABLE_FIELDS if f in self.cleaned_data]
                data = {f: self.cleaned_data[f] for f in writable if current is None or f in self.changed_data}
                body = ToolSerializer(current, data=data, partial=current is not None,
                                      context={"tenant": self.cleaned_data.get("tenant") or getattr(current, "tenant", None)})
                if not body.is_valid():
                    for name, problems in body.errors.items():
                        self.add_error(name if name in self.fields else None, [str(p) for p in problems]
                                       if isinstance(problems, list) else str(problems))
                    return
                if "approval_policy" in self.changed_data:
                    for problem in approval_policy.policy_errors(self.cleaned_data.get("approval_policy") or {}):
                        self.add_error("approval_policy", problem)
                if current is not None:
                    for problem in services.approval_loosening_refusal(tool=current, actor=actor, fields=self.cleaned_data,
                                                                       changed=list(self.changed_data)):
                        self.add_error(problem[0], problem[1])
                    if "rate_limit_per_minute" in self.changed_data:  # a plugin's limit is a floor
                        refusal = services.rate_limit_refusal(tool=current, value=self.cleaned_data.get("rate_limit_per_minute"))
                        if refusal:
                            self.add_error("rate_limit_per_minute", refusal)

        return CheckedToolForm

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Through the tool service: the same validation, the same floors and the same audit row as the API."""
        actor = self._actor(request)
        fields = {name: form.cleaned_data[name] for name in services.TOOL_FIELDS if name in form.cleaned_data}
        if change:
            saved = services.update_tool(tool=obj, actor=actor, **{k: v for k, v in fields.items() if k in form.changed_data})
        else:
            saved = services.create_tool(tenant=form.cleaned_data["tenant"], actor=actor, **fields)
        obj.pk = saved.pk
        obj._state.adding = False

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        services.delete_tool(tool=obj, actor=self._actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for tool in queryset.select_related("tenant", "plugin_install"):
            self.delete_model(request, tool)

    @admin.action(description="Kill switch: switch the selected tools off", permissions=["change"])
    def switch_off(self, request: HttpRequest, queryset: Any) -> None:
        queryset = queryset.for_actor(self._actor(request), "operate")
        for tool in queryset.select_related("tenant"):
            services.set_tool_enabled(tool=tool, enabled=False, actor=self._actor(request))
        self.message_user(request, f"Switched off {queryset.count()} tool(s); the next call is refused.")

    @admin.action(description="Switch the selected tools back on", permissions=["change"])
    def switch_on(self, request: HttpRequest, queryset: Any) -> None:
        queryset = queryset.for_actor(self._actor(request), "operate")
        for tool in queryset.select_related("tenant"):
            services.set_tool_enabled(tool=tool, enabled=True, actor=self._actor(request))
        self.message_user(request, f"Switched on {queryset.count()} tool(s).")


from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from agents import attention, shadow
from agents import services as agent_services
from agents.erasure import ERASE_ACTION, ErasureRefused, erase_session
from agents.flow_graph import render_svg
from agents.models import Agent, AgentKind, AgentVersion, Flow, FlowVersion, Run, RunEvent, Session
from core.documents import DocumentWidget
from core.errors import DomainError
from core.numbers import number_or_text
from core.parsers import loads_bounded
from llm.pricing import DEMO_PRICE_LABEL, demo_price_text, is_demo_price
from runtime.documents import DocumentError, parse
from runtime.flows import FlowDefinition
from runtime.policy_document import Policy
from tenants.admin_mixins import TenantScopedAdmin


class ReadOnlyAdmin(TenantScopedAdmin):
    read_only = True


@admin.register(Agent)
class AgentAdmin(TenantScopedAdmin):
    list_display = ["slug", "name", "tenant", "current_version", "updated_at"]
    list_filter = ["tenant"]
    list_select_related = ["tenant", "current_version"]
    search_fields = ["slug", "name"]
    inlines: list[Any] = []  # the marketplace adds its release weights here (marketplace/admin.py)

    kind = AgentKind.AGENT
    exclude = ["kind"]  # agents and flows each have their own admin

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).filter(kind=self.kind)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # An agent's slug names it in URLs, sessions and presets: made once, never changed.
        base = [*super().get_readonly_fields(request, obj), "updated_at"]
        return [*base, "tenant", "slug"] if obj is not None else base

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """The form asks the release gate about a new current version, so that a refusal is the field's error (its audit
        row kept); saving asks again, through the same service as the API."""
        base = super().get_form(request, obj, change, **kwargs)
        actor = self._actor(request)

        class GateCheckedForm(base):  # type: ignore[valid-type,misc]
            def clean(self) -> Any:
                cleaned = super().clean()
                if self.instance.pk is None or "current_version" not in self.changed_data or self.has_error("current_version"):
                    return cleaned
                try:
                    agent_services.check_current_version(actor=actor, agent=Agent.objects.get(pk=self.instance.pk),
                                                         version=cleaned.get("current_version"))
                except DomainError as exc:
                    self.add_error("current_version", exc.message)
                return cleaned

        return GateCheckedForm

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Through the agent services: the same checks and the same audit row as the API."""
        actor = self._actor(request)  # the form already refused a taken slug (the model's unique constraint)
        if change:
            changed = {name: form.cleaned_data[name] for name in agent_services.AGENT_FIELDS if name in form.changed_data}
            saved = agent_services.update_agent(actor=actor, agent=Agent.objects.get(pk=obj.pk), **changed)
        else:
            saved = agent_services.create_agent(actor=actor, tenant=obj.tenant, slug=obj.slug, name=obj.name,
                                                description=obj.description, kind=self.kind)
        obj.pk = saved.pk
        obj._state.adding = False

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        # An agent with runs is protected (Run.agent is PROTECT): the admin lists them and never gets here.
        agent_services.delete_agent(actor=self._actor(request), agent=obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for agent in queryset:
            self.delete_model(request, agent)


@admin.register(AgentVersion)
class AgentVersionAdmin(TenantScopedAdmin):
    list_display = ["agent", "number", "model", "tenant", "created_at"]
    list_filter = ["tenant", "model"]
    list_select_related = ["agent", "tenant"]
    actions = ["new_version_from"]
    author_field = "created_by"  # who made a version is the user saving it, never a choice
    kind = AgentKind.AGENT
    exclude = ["definition"]
    change_form_template = "admin/agents/agentversion/change_form.html"

    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
                        extra_context: Any = None) -> Any:
        if request.method == "POST" and object_id and "_preview_impact" in request.POST:
            return self._preview_impact(request, object_id)
        extra = dict(extra_context or {})
        if object_id:
            version = self.get_object(request, object_id)
            if version is not None:
                extra["preview_fields"] = self._preview_fields(request, version)
        return super().changeform_view(request, object_id, form_url, extra)

    def _preview_fields(self, request: HttpRequest, version: Any) -> list[dict[str, Any]]:
        """The fields a preview proposes (tools, policy: those this admin edits), each with whether the form shows an
        input for it; a used (locked) version's form is read-only, so the button's own box holds the proposal."""
        editable = set(self.get_form(request, version, change=True).base_fields) - set(self.get_readonly_fields(request, version))
        shown = [f for f in shadow.VERSION_FIELDS if f not in (self.exclude or [])]
        return [{"name": f, "in_form": f in editable, "value": json.dumps(getattr(version, f), indent=2, ensure_ascii=False)}
                for f in shown]

    def _preview_impact(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The impact of the proposed, unsaved tool list / policy on the calls this version's runs made
        (``agents.shadow.preview_version_change``); validated as saving them would be; saves nothing."""
        version = self.get_object(request, object_id)
        if version is None or not self.has_view_permission(request, version):
            raise Http404("No such version.")
        errors: dict[str, list[str]] = {}
        fields: dict[str, Any] = {}
        for spec in self._preview_fields(request, version):
            raw = request.POST.get(spec["name"])
            if raw is None:
                continue
            try:
                fields[spec["name"]] = loads_bounded(raw)
            except json.JSONDecodeError as exc:
                errors[spec["name"]] = [f"Must be JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})."]
            except ValueError as exc:
                errors[spec["name"]] = [f"Must be JSON within bounds: {exc}."]
        impact: dict[str, Any] = {}
        if not errors:
            probe = AgentVersion.objects.select_related("agent", "tenant").get(pk=version.pk)
            probe.pk = None  # checked as a new version would be (a used version's own checks are skipped: it is history)
            for name, value in fields.items():
                setattr(probe, name, value)
            raw_days = request.POST.get("_preview_days") or "7"
            try:
                probe.clean()
                # what the proposal changes, as it would be stored (the policy normalised); an unchanged box proposes nothing
                fields = {name: getattr(probe, name) for name, value in fields.items() if value != getattr(version, name)}
                impact = shadow.preview_version_change(
                    version=AgentVersion.objects.select_related("agent__tenant").get(pk=version.pk),
                    actor=self._actor(request), fields=fields, days=number_or_text(raw_days))
            except ValidationError as exc:
                errors = {k: [str(m) for m in v] for k, v in exc.message_dict.items()} if hasattr(exc, "error_dict") \
                    else {"__all__": list(exc.messages)}
            except DomainError as exc:
                errors = {getattr(exc, "field", None) or "__all__": [exc.message]}
        rows = [(label, impact[key]) for label, key in (
            ("Newly denied", "newly_denied"), ("Newly needs approval", "newly_needs_approval"),
            ("Newly rate limited", "newly_rate_limited"), ("Newly allowed", "newly_allowed"))] if impact else []
        context = {**self.admin_site.each_context(request), "title": f"Impact of a change to {version}", "version": version,
                   "impact": impact, "rows": rows, "errors": errors, "opts": self.model._meta, "back": request.path}
        return TemplateResponse(request, "admin/agents/agentversion/preview_impact.html", context,
                                status=400 if errors else 200)

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).filter(agent__kind=self.kind)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)
        if db_field.name == "agent" and field is not None:
            field.queryset = field.queryset.filter(kind=self.kind)
        return field

    @admin.action(description="New version from this one (a copy you can edit)")
    def new_version_from(self, request: HttpRequest, queryset: Any) -> None:
        actor = self._actor(request)
        for version in queryset.select_related("agent"):
            try:
                copy = agent_services.copy_version(actor=actor, version=version)
            except (DomainError, ValidationError) as exc:
                self.message_user(request, f"{version}: {getattr(exc, 'message', None) or '; '.join(getattr(exc, 'messages', [str(exc)]))}",
                                  messages.ERROR)
            else:
                self.message_user(request, f"Created {copy} from v{version.number}.")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and obj.is_locked:
            # A version a run used is history: make a new version instead.
            return [f.name for f in self.model._meta.fields]
        return [*super().get_readonly_fields(request, obj), "created_at"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """The form also holds the tools' approval floors for this user (a form error, as the service would refuse)."""
        kwargs.setdefault("widgets", {}).update(policy=DocumentWidget(Policy), definition=DocumentWidget(FlowDefinition))
        base = super().get_form(request, obj, change, **kwargs)
        actor = self._actor(request)

        class FloorCheckedForm(base):  # type: ignore[valid-type,misc]
            def _post_clean(self) -> None:
                super()._post_clean()
                if "policy" not in self.fields or self.has_error("policy") or self.instance.is_locked:
                    return
                before = AgentVersion.objects.filter(pk=self.instance.pk).values_list("policy", flat=True).first()
                for error in agent_services.approval_floor_errors(actor=actor, version=self.instance, before=before):
                    self.add_error("policy", error)

        return FloorCheckedForm

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Through the services (authorship from the request, audit rows, the approval floors)."""
        actor = self._actor(request)
        if change:
            fields = {name: getattr(obj, name) for name in agent_services.VERSION_FIELDS if name in form.changed_data}
            if not fields:
                return  # nothing a version is made of changed (a used version shows read-only and stays as it is)
            saved = agent_services.update_version(actor=actor, version=obj, **fields)
        else:
            fields = {name: getattr(obj, name) for name in agent_services.VERSION_FIELDS}
            saved = agent_services.create_version(actor=actor, agent=obj.agent, number=obj.number, **fields)
        obj.pk, obj.number, obj.created_by, obj.policy = saved.pk, saved.number, saved.created_by, saved.policy
        obj._state.adding = False

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        agent_services.delete_version(actor=self._actor(request), version=obj)  # refuses a version a run used

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for version in queryset.select_related("agent", "tenant"):
            self.delete_model(request, version)


@admin.register(Flow)
class FlowAdmin(AgentAdmin):
    """Flows: agents whose versions hold a graph; their versions are edited under Flow versions."""

    kind = AgentKind.FLOW
    inlines: list[Any] = []


@admin.register(FlowVersion)
class FlowVersionAdmin(AgentVersionAdmin):
    """A flow's versions: the graph as a checked JSON document, drawn beside it."""

    kind = AgentKind.FLOW
    exclude = ["tools", "system_prompt"]
    list_display = ["agent", "number", "nodes", "tenant", "created_at"]
    list_filter = ["tenant"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [*super().get_readonly_fields(request, obj), "graph"]

    @admin.display(description="nodes")
    def nodes(self, obj: Any) -> int:
        return len((obj.definition or {}).get("nodes") or [])

    @admin.display(description="graph")
    def graph(self, obj: Any) -> Any:
        try:
            flow = parse(FlowDefinition, obj.definition) if obj is not None and obj.definition else None
        except DocumentError:
            flow = None
        if flow is None:
            return "Drawn once the definition is saved."
        return mark_safe(render_svg(flow))  # noqa: S308 (every tenant-written text is escaped by render_svg)


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    list_display = ["id", "agent", "tenant", "turns", "model_calls", "created_at", "erased_at"]
    list_filter = ["tenant"]
    list_select_related = ["agent", "tenant"]
    actions = ["erase_sessions"]

    def get_actions(self, request: HttpRequest) -> Any:
        actions = super().get_actions(request)
        if self._actor(request).tenant_ids(ERASE_ACTION) == []:
            actions.pop("erase_sessions", None)  # only owners (and superusers) erase
        return actions

    @admin.action(description="Erase the selected sessions (a data-subject request; irreversible)")
    def erase_sessions(self, request: HttpRequest, queryset: Any) -> Any:
        """After a confirmation page with a reason: the same service as the API's DELETE (agents/erasure.py)."""
        actor = self._actor(request)
        allowed = list(queryset.for_actor(actor, ERASE_ACTION).select_related("agent", "tenant"))
        reason = request.POST.get("reason", "").strip()
        if request.POST.get("confirmed") != "yes" or not reason:
            return TemplateResponse(request, "admin/agents/session/erase_confirmation.html", {
                **self.admin_site.each_context(request), "title": "Erase sessions", "opts": self.model._meta,
                "sessions": allowed, "skipped": queryset.count() - len(allowed), "missing_reason": "confirmed" in request.POST,
            })
        erased = 0
        for session in allowed:
            try:
                result = erase_session(actor=actor, session=session, reason=reason, via="admin")
            except ErasureRefused as exc:
                self.message_user(request, f"{session}: {exc}", messages.ERROR)
            else:
                erased += 0 if result.already else 1
        self.message_user(request, f"Erased {erased} session(s); the audit keeps a tombstone of each (session.erased).")
        return None


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["id", "agent", "version__number", "status", "terminal_reason", "attention", "playground", "step", "cost",
                    "tenant", "created_at", "finished_at", "trace"]
    list_filter = ["needs_attention", "playground", "status", "terminal_reason", "tenant"]
    list_select_related = ["agent", "version", "tenant"]
    search_fields = ["id", "input"]
    date_hierarchy = "created_at"
    actions = ["resolve_attention"]

    class Media:
        css = {"all": ["agents/admin.css"]}

    @admin.display(description="trace")
    def trace(self, obj: Run) -> str:
        return format_html('<a href="/console/runs/{}/">trace</a>', obj.pk)

    @admin.display(description="cost")
    def cost(self, obj: Run) -> str:
        """The run's cost; a demo-priced model's says so (its price is invented, not a real one)."""
        value = float((obj.usage or {}).get("cost") or 0)
        if obj.version is not None and is_demo_price(obj.version.model):
            return format_html('{} <span class="demo-price" title="{}">{}</span>', f"{value:.4f}",
                               f"invented for the demo: {demo_price_text()}; not a real price", DEMO_PRICE_LABEL)
        return f"{value:.4f}"

    @admin.display(description="attention", ordering="needs_attention")
    def attention(self, obj: Run) -> str:
        if obj.needs_attention:
            kinds = ", ".join(sorted({str(r.get("kind")) for r in attention.open_reasons(obj)})) or "needs attention"
            return format_html('<span class="attention-badge" title="{}">needs attention</span>', kinds)
        if obj.attention_resolved_at is not None:
            return format_html('<span class="attention-resolved" title="resolved {}">resolved</span>',
                               f"{obj.attention_resolved_at:%Y-%m-%d %H:%M}")
        return ""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [*super().get_readonly_fields(request, obj), "trace", "attention", "cost"]

    def get_actions(self, request: HttpRequest) -> Any:
        actions = super().get_actions(request)
        if self._actor(request).tenant_ids(attention.RESOLVE_ACTION) == []:
            actions.pop("resolve_attention", None)  # viewers and approvers look, operators resolve
        return actions

    @admin.action(description="Resolve attention (say what you checked)")
    def resolve_attention(self, request: HttpRequest, queryset: Any) -> Any:
        """After a page asking what was checked: the same service as the API's resolve-attention (agents/attention.py)."""
        actor = self._actor(request)
        allowed = list(queryset.for_actor(actor, attention.RESOLVE_ACTION).filter(needs_attention=True)
                       .select_related("agent", "tenant"))
        note = request.POST.get("note", "").strip()
        if request.POST.get("confirmed") != "yes" or not note:
            return TemplateResponse(request, "admin/agents/run/resolve_attention.html", {
                **self.admin_site.each_context(request), "title": "Resolve attention", "opts": self.model._meta,
                "runs": [(run, attention.open_reasons(run)) for run in allowed], "skipped": queryset.count() - len(allowed),
                "missing_note": "confirmed" in request.POST, "note_max": attention.NOTE_MAX_CHARS,
            })
        resolved = 0
        for run in allowed:
            try:
                attention.resolve_attention(actor=actor, run=run, note=note, via="admin")
            except (attention.AttentionRefused, PermissionDenied) as exc:
                self.message_user(request, f"{run}: {exc}", messages.ERROR)
            else:
                resolved += 1
        self.message_user(request, f"Resolved {resolved} run(s); the audit records it (run.attention_resolved).")
        return None


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ["run", "seq", "type", "step", "at"]
    list_filter = ["type", "tenant"]
    search_fields = ["run__id"]

from agents import provider_admin  # noqa: E402,F401  (registers the Provider admin)

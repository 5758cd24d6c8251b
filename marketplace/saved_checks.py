"""Today's save-time checks, run again over what is stored (``manage.py check_saved``).

The checks at save have grown stricter (patterns whose repeats multiply past 1,000 elements, schemas of more than
1,000 objects or 200 patterns, expressions nested past 64 levels, flows of more than 400 nodes, versions naming more
than 128 tools, tools uninstalled since), and what was saved before stays as it was, failing only when used (a flow's
input refused at the run's start, a policy refused as invalid, a tool's call refused naming its schema). This finds
them first. It reads and reports; it changes nothing (a version a run used is history: the fix is a new version).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from django.core.exceptions import ValidationError

from agents.models import AgentKind, AgentVersion, Run
from marketplace.models import ReleaseWeight
from tools.models import Tool
from tools.serializers import schema_problems


@dataclass
class SavedProblem:
    tenant: str
    kind: str  # "agent version", "flow version" or "tool"
    name: str  # "refund-desk v3", or a tool's name
    errors: dict[str, list[str]]
    #: a version new runs may get (the agent's current version, or one with a release weight above 0); an enabled tool
    live: bool = False
    #: a version runs used: immutable, fixed by a new version
    used: bool = False
    id: str = field(default="")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        live = "enabled" if self.kind == "tool" else "live: new runs get it"
        notes = [n for n, on in ((live, self.live), ("used by runs: make a new version", self.used)) if on]
        what = f"{self.tenant} · {self.kind} {self.name}" + (f" ({'; '.join(notes)})" if notes else "")
        return what + "\n" + "\n".join(f"    {key}: {message}" for key, messages in self.errors.items() for message in messages)


def _version_errors(version: AgentVersion) -> dict[str, list[str]]:
    try:
        version.check_contents()  # normalises policy and definition in memory only: nothing here saves
    except ValidationError as exc:
        return {key: [str(m) for m in messages] for key, messages in exc.message_dict.items()}
    return {}


def _tool_errors(tool: Tool) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if found := schema_problems(tool.parameters):
        errors["parameters"] = found
    if found := schema_problems(tool.output_schema, root_object=False):
        errors["output_schema"] = found
    return errors


def saved_problems(*, tenant_slug: str = "", live_only: bool = False) -> Iterator[SavedProblem]:
    """The stored versions and tools that today's checks at save would refuse, tenant by tenant."""
    versions = AgentVersion.objects.select_related("agent", "tenant").order_by("tenant__slug", "agent__slug", "number")
    tools = Tool.objects.select_related("tenant").order_by("tenant__slug", "name")
    weights = ReleaseWeight.objects.filter(weight__gt=0)
    if tenant_slug:
        versions, tools, weights = (q.filter(tenant__slug=tenant_slug) for q in (versions, tools, weights))
    weighted = set(weights.values_list("version_id", flat=True))
    found: list[SavedProblem] = []
    for version in versions.iterator(chunk_size=200):
        live = version.agent.current_version_id == version.pk or version.pk in weighted
        if live_only and not live:
            continue
        errors = _version_errors(version)
        if errors:
            kind = "flow version" if version.agent.kind == AgentKind.FLOW else "agent version"
            found.append(SavedProblem(version.tenant.slug, kind, f"{version.agent.slug} v{version.number}", errors,
                                      live=live, id=str(version.pk)))
    # which of them runs used: one query for all of them, not one each
    ran = Run.objects.filter(version_id__in=[p.id for p in found]).order_by().values_list("version_id", flat=True)
    used = {str(pk) for pk in ran.distinct()}
    for problem in found:
        problem.used = problem.id in used
        yield problem
    for tool in tools.iterator(chunk_size=200):
        errors = _tool_errors(tool)
        if errors:
            yield SavedProblem(tool.tenant.slug, "tool", tool.name, errors, live=tool.enabled, id=str(tool.pk))

"""What the console's pages read: run rows, run-list filters and the spend aggregates.

Every query starts from ``for_actor`` (tenants/scoping.py); nothing here filters by tenant by
hand. Spend is aggregated in Python over a bounded window of runs, so the same code works on
PostgreSQL and SQLite (``Run.usage`` is a JSON field) and its cost is capped.
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.db.models import QuerySet
from django.utils import timezone

from agents.models import Agent, AgentVersion, Run, RunStatus
from console.filters import TERMINAL_REASONS, RunListFilter
from llm.pricing import demo_price_text, is_demo_price
from tenants.models import Membership
from tenants.scoping import Actor

RUN_LIST_PAGE = 50
SPEND_MAX_RUNS = 20_000
SPEND_MAX_DAYS = 366
TOP_RUNS = 10


# --- formatting (shared by the templates and the live run-list socket) ----------------------

def tokens_text(value: int) -> str:
    return f"{value:,}"


def cost_text(value: float) -> str:
    return f"{value:,.4f}" if value < 100 else f"{value:,.2f}"


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def usage_of(raw: Any) -> tuple[int, int, float]:
    """``(input_tokens, output_tokens, cost)`` from a ``usage`` JSON value, tolerant of missing or bad fields."""
    usage = raw if isinstance(raw, Mapping) else {}

    def num(key: str) -> float:
        try:
            value = float(usage.get(key) or 0)
        except (TypeError, ValueError):
            return 0.0
        return value if value > 0 else 0.0

    return int(num("input_tokens")), int(num("output_tokens")), num("cost")


def run_row(run: Run, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """One run as the run list shows it (template and websocket alike). Expects agent, version,
    tenant, created_by and api_key to be selected with the run."""
    input_tokens, output_tokens, cost = usage_of(run.usage)
    end = run.finished_at or (now or timezone.now())
    duration = (end - run.started_at).total_seconds() if run.started_at else None
    user = run.created_by.get_username() if run.created_by_id and run.created_by else ""
    if run.api_key_id and run.api_key:
        user = f"{user} (key {run.api_key.name})" if user else f"key {run.api_key.name}"
    return {
        "id": str(run.pk),
        "url": f"/console/runs/{run.pk}/",
        "tenant": run.tenant.slug,
        "agent": run.agent.slug,
        "agent_id": run.agent_id,
        "version": run.version.number,
        "version_id": run.version_id,
        "status": run.status,
        "terminal_reason": run.terminal_reason or "",
        "user": user or "—",
        "user_id": run.created_by_id,
        "step": run.step,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "tokens": input_tokens + output_tokens,
        "tokens_text": tokens_text(input_tokens + output_tokens),
        "cost": cost,
        "cost_text": cost_text(cost),
        "duration_s": duration,
        "duration_text": duration_text(duration),
        "created_at": run.created_at.isoformat(),
        "created_text": timezone.localtime(run.created_at).strftime("%Y-%m-%d %H:%M:%S"),
        "input_preview": run.input[:120],
        "needs_attention": bool(run.needs_attention),
        "playground": bool(run.playground),
    }


def runs_for(actor: Actor) -> QuerySet[Run]:
    return Run.objects.for_actor(actor, "view").select_related("tenant", "agent", "version", "created_by", "api_key")


# --- run-list filters -----------------------------------------------------------------------

@dataclass
class RunFilters:
    """The run list's GET parameters: ``agent``, ``version``, ``user`` (ids), ``status``, ``reason``,
    ``day`` and ``since`` (YYYY-MM-DD, UTC), ``attention`` (1: only runs that need attention, 0: only the others).

    Parsed and applied by :class:`console.filters.RunListFilter`; a bad value is ignored, with a message in ``errors``.
    """

    agent: int | None = None
    version: int | None = None
    user: int | None = None
    status: str = ""
    reason: str = ""
    attention: str = ""
    day: dt.date | None = None
    since: dt.date | None = None
    errors: list[str] = field(default_factory=list)

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> RunFilters:
        data = {name: params.get(name, "") for name in RunListFilter.base_filters}
        checked = RunListFilter(data=data, queryset=Run.objects.none())
        errors = []
        if not checked.is_valid():
            for name, problems in checked.errors.items():
                problem = str(problems[0])
                errors.append(f"{name} {problem[:1].lower()}{problem[1:]} The filter was ignored.")
                data[name] = ""
            checked = RunListFilter(data=data, queryset=Run.objects.none())
            checked.is_valid()
        values = {k: v for k, v in checked.form.cleaned_data.items() if v not in (None, "")}
        return cls(**values, errors=errors)

    def apply(self, runs: QuerySet[Run]) -> QuerySet[Run]:
        return RunListFilter(data=self.params(), queryset=runs).qs

    def params(self) -> dict[str, str]:
        raw = {
            "agent": self.agent, "version": self.version, "user": self.user, "status": self.status,
            "reason": self.reason, "attention": self.attention, "day": self.day, "since": self.since,
        }
        return {k: str(v) for k, v in raw.items() if v not in (None, "")}

    def query(self, **extra: Any) -> str:
        return urlencode({**self.params(), **{k: v for k, v in extra.items() if v not in (None, "")}})

    @property
    def active(self) -> bool:
        return bool(self.params())


def filter_choices(actor: Actor) -> dict[str, Any]:
    agents = Agent.objects.for_actor(actor).select_related("tenant").order_by("tenant__slug", "slug")
    members = (
        Membership.objects.for_actor(actor).select_related("user").order_by("user__username").values_list("user_id", "user__username")
    )
    users = sorted(set(members), key=lambda pair: pair[1])
    return {
        "agents": [(a.pk, f"{a.tenant.slug}/{a.slug}") for a in agents],
        "statuses": list(RunStatus.choices),
        "reasons": TERMINAL_REASONS,
        "users": users,
    }


def version_label(actor: Actor, version_id: int | None) -> str:
    if version_id is None:
        return ""
    version = AgentVersion.objects.for_actor(actor).select_related("agent").filter(pk=version_id).first()
    return str(version) if version else "unknown version"


# --- spend ----------------------------------------------------------------------------------

@dataclass
class Totals:
    runs: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0

    def add(self, input_tokens: int, output_tokens: int, cost: float) -> None:
        self.runs += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cost += cost

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def tokens_text(self) -> str:
        return tokens_text(self.tokens)

    @property
    def cost_text(self) -> str:
        return cost_text(self.cost)


@dataclass
class Spend:
    since: dt.date
    until: dt.date
    days: int
    total: Totals
    by_agent: list[dict[str, Any]]
    by_version: list[dict[str, Any]]
    by_day: list[dict[str, Any]]
    top_runs: list[dict[str, Any]]
    truncated: bool
    chart: dict[str, Any]
    #: Playground runs (the console's playground): kept out of every figure above, summed here, by version.
    playground: Totals = field(default_factory=Totals)
    playground_by_version: list[dict[str, Any]] = field(default_factory=list)
    demo_priced: bool = False  # some cost in this window comes from the demo price table (not a real price)
    demo_price_text: str = field(default_factory=demo_price_text)


def spend_for(actor: Actor, *, days: int, now: dt.datetime | None = None) -> Spend:
    """Tokens and cost by agent, version and day over the last ``days`` days (UTC), plus the costliest runs."""
    now = now or timezone.now()
    until = now.astimezone(dt.UTC).date()
    since = until - dt.timedelta(days=days - 1)
    start = dt.datetime.combine(since, dt.time.min, tzinfo=dt.UTC)
    rows = list(
        Run.objects.for_actor(actor)
        .filter(created_at__gte=start)
        .order_by("-created_at")
        .values_list("id", "tenant__slug", "agent_id", "agent__slug", "version_id", "version__number",
                     "created_at", "usage", "status", "terminal_reason", "version__model", "playground")[: SPEND_MAX_RUNS + 1]
    )
    truncated = len(rows) > SPEND_MAX_RUNS
    rows = rows[:SPEND_MAX_RUNS]

    total = Totals()
    agents: dict[int, tuple[str, Totals]] = {}
    versions: dict[int, tuple[str, int, Totals]] = {}
    demo_versions: set[int] = set()
    per_day: dict[dt.date, Totals] = {since + dt.timedelta(days=i): Totals() for i in range(days)}
    top: list[tuple[float, int, str, dict[str, Any]]] = []
    playground = Totals()
    playground_versions: dict[int, tuple[str, int, Totals]] = {}
    for run_id, tenant, agent_id, agent, version_id, number, created, usage, status, reason, model, is_play in rows:
        i, o, c = usage_of(usage)
        if is_demo_price(model or ""):
            demo_versions.add(version_id)
        label = f"{tenant}/{agent}"
        if is_play:  # counted apart: an operator trying a version is not the tenant's production spend
            playground.add(i, o, c)
            playground_versions.setdefault(version_id, (label, number, Totals()))[2].add(i, o, c)
            continue
        total.add(i, o, c)
        agents.setdefault(agent_id, (label, Totals()))[1].add(i, o, c)
        versions.setdefault(version_id, (label, number, Totals()))[2].add(i, o, c)
        day = created.astimezone(dt.UTC).date()
        if day in per_day:
            per_day[day].add(i, o, c)
        item = {"id": str(run_id), "agent": label, "version": number, "status": status, "terminal_reason": reason,
                "tokens_text": tokens_text(i + o), "cost_text": cost_text(c), "created": created}
        entry = (c, i + o, str(run_id), item)
        if len(top) < TOP_RUNS:
            heapq.heappush(top, entry)
        elif entry[:3] > top[0][:3]:
            heapq.heapreplace(top, entry)

    by_agent = sorted(
        ({"id": aid, "label": label, "totals": t} for aid, (label, t) in agents.items()),
        key=lambda r: (-r["totals"].cost, -r["totals"].tokens, r["label"]),
    )
    by_version = sorted(
        ({"id": vid, "label": f"{label} v{number}", "totals": t, "demo_price": vid in demo_versions}
         for vid, (label, number, t) in versions.items()),
        key=lambda r: (-r["totals"].cost, -r["totals"].tokens, r["label"]),
    )
    by_day = [{"day": day, "totals": t} for day, t in per_day.items()]
    top_runs = [entry[3] for entry in sorted(top, key=lambda e: e[:3], reverse=True)]
    playground_by_version = sorted(
        ({"id": vid, "label": f"{label} v{number}", "totals": t} for vid, (label, number, t) in playground_versions.items()),
        key=lambda r: (-r["totals"].cost, -r["totals"].tokens, r["label"]),
    )
    return Spend(since, until, days, total, by_agent, by_version, by_day, top_runs, truncated, _chart(by_day, total),
                 playground=playground, playground_by_version=playground_by_version, demo_priced=bool(demo_versions))


CHART_WIDTH = 720
CHART_HEIGHT = 160


def _chart(by_day: list[dict[str, Any]], total: Totals) -> dict[str, Any]:
    """Bars per day for an inline SVG (no script, no library): cost, or tokens when nothing was priced."""
    metric = "cost" if total.cost > 0 else "tokens"
    values = [float(d["totals"].cost if metric == "cost" else d["totals"].tokens) for d in by_day]
    peak = max(values, default=0.0) or 1.0
    slot = CHART_WIDTH / max(len(values), 1)
    bars = []
    for index, (day, value) in enumerate(zip(by_day, values, strict=True)):
        height = round(value / peak * (CHART_HEIGHT - 20), 1)
        bars.append({
            "day": day["day"],
            "x": round(index * slot + slot * 0.1, 1),
            "width": round(max(slot * 0.8, 1.0), 1),
            "y": round(CHART_HEIGHT - height, 1),
            "height": height,
            "label": f"{day['day']:%Y-%m-%d}: {day['totals'].cost_text} cost, {day['totals'].tokens_text} tokens, "
                     f"{day['totals'].runs} runs",
        })
    peak_text = cost_text(peak) if metric == "cost" else tokens_text(int(peak))
    return {"metric": metric, "bars": bars, "width": CHART_WIDTH, "height": CHART_HEIGHT, "peak_text": peak_text}

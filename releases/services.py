"""Evaluation sets and replay batches: the one place the API, the admin, the console and the tasks change them."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agents.models import Agent, AgentKind, AgentVersion, Run, RunStatus
from audit.masking import mask_text
from audit.services import record_change
from core.errors import Conflict, Invalid
from releases import diffs, metrics, recording
from releases.flow_replay import replay_flow
from releases.models import BatchStatus, EvaluationSet, EvaluationSetRun, MissPolicy, ModelMode, ReplayBatch, ReplayRun, ReplayShard
from releases.replay import Candidate, replay
from tenants.models import Tenant
from tenants.scoping import Actor
from tools.models import Tool

log = logging.getLogger(__name__)

MAX_SET_RUNS = 5000
CHUNK = 50  # results and progress are committed per chunk: the batch row moves every 50 runs
MAX_CONCURRENCY = 8
ENDED = (BatchStatus.FINISHED, BatchStatus.FAILED, BatchStatus.CANCELLED)


def _require(actor: Actor, tenant_id: int, doing: str) -> None:
    actor.require("operate", tenant_id)  # a foreign tenant: not found; a viewer: forbidden naming the role


def _when(value: Any, name: str) -> dt.datetime:
    expected = f"filters.{name} must be an ISO 8601 date-time like 2026-12-01T00:00:00Z; got {value!r}"
    try:  # parse_datetime: None for a wrong form, ValueError for an impossible value (an offset of +99:00)
        parsed = parse_datetime(value) if isinstance(value, str) else value if isinstance(value, dt.datetime) else None
    except ValueError as exc:
        raise Invalid(f"{expected} ({exc}).", field=f"filters.{name}") from None
    if parsed is None:
        raise Invalid(f"{expected}.", field=f"filters.{name}")
    try:  # in UTC now: 0001-01-01T00:00+05:00 is out of range there, and would fail in the query
        return (parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, dt.UTC)).astimezone(dt.UTC)
    except (ValueError, OverflowError) as exc:
        raise Invalid(f"filters.{name} is out of range ({exc}); got {value!r}.", field=f"filters.{name}") from None


FILTER_KEYS = ("versions", "created_after", "created_before", "terminal_reason", "limit", "playground")


def _filtered(agent: Agent, filters: dict[str, Any]) -> list[Any]:
    if "tags" in filters:
        raise Invalid("runs carry no tags in this console; choose them by versions, created_after/created_before, "
                      "terminal_reason, playground, or pick them with run_ids.", field="filters.tags")
    if "status" in filters and filters["status"] != RunStatus.FINISHED:
        raise Invalid(f"only finished runs can be replayed (they have a recording to compare with); "
                      f"got status {filters['status']!r}.", field="filters.status")
    filters = {k: v for k, v in filters.items() if k != "status"}
    unknown = sorted(set(filters) - set(FILTER_KEYS))
    if unknown:
        raise Invalid(f"unknown filter(s) {', '.join(unknown)}; filters are {', '.join(FILTER_KEYS)} "
                      "(only finished runs are chosen).", field="filters")
    runs = Run.objects.filter(tenant_id=agent.tenant_id, agent=agent, status=RunStatus.FINISHED,
                              playground=bool(filters.get("playground", False)))
    if "versions" in filters:
        versions = filters["versions"]
        if not isinstance(versions, list) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**31
                                                     for v in versions):
            raise Invalid("filters.versions must be a list of version numbers like [1, 2].", field="filters.versions")
        runs = runs.filter(version__number__in=versions)
    if "created_after" in filters:
        runs = runs.filter(created_at__gte=_when(filters["created_after"], "created_after"))
    if "created_before" in filters:
        runs = runs.filter(created_at__lt=_when(filters["created_before"], "created_before"))
    if "terminal_reason" in filters:
        reasons = filters["terminal_reason"]
        reasons = [reasons] if isinstance(reasons, str) else reasons
        if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
            raise Invalid("filters.terminal_reason must be a reason or a list of them, like ['final_answer'].",
                          field="filters.terminal_reason")
        runs = runs.filter(terminal_reason__in=reasons)
    limit = filters.get("limit", 100)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SET_RUNS:
        raise Invalid(f"filters.limit must be a whole number from 1 to {MAX_SET_RUNS}; got {limit!r}.", field="filters.limit")
    return list(runs.order_by("-created_at").values_list("pk", flat=True)[:limit])


def _picked(agent: Agent, run_ids: Iterable[Any]) -> list[Any]:
    wanted: list[Any] = []
    for raw in run_ids:
        try:
            wanted.append(uuid.UUID(str(raw)))
        except ValueError:
            raise Invalid(f"run_ids holds {raw!r}, which is not a run id (a UUID).", field="run_ids") from None
    if len(wanted) > MAX_SET_RUNS:
        raise Invalid(f"a set holds at most {MAX_SET_RUNS} runs; got {len(wanted)}.", field="run_ids")
    found = dict(Run.objects.filter(pk__in=wanted, tenant_id=agent.tenant_id, agent=agent).values_list("pk", "status"))
    missing = [str(r) for r in wanted if r not in found]
    if missing:  # another tenant's run, another agent's, or none: the same answer (never says which)
        raise Invalid(f"no run of {agent.slug!r} with id(s) {', '.join(missing[:5])}"
                      f"{' and more' if len(missing) > 5 else ''}.", field="run_ids")
    unfinished = [str(r) for r in wanted if found[r] != RunStatus.FINISHED]
    if unfinished:
        raise Invalid(f"only finished runs can be replayed; not finished: {', '.join(unfinished[:5])}.", field="run_ids")
    return list(dict.fromkeys(wanted))


@transaction.atomic
def create_evaluation_set(*, tenant: Tenant, actor: Actor, name: str, agent: Agent, filters: dict[str, Any] | None = None,
                          run_ids: list[Any] | None = None, description: str = "") -> EvaluationSet:
    """A named set of the agent's finished runs, chosen by ``filters`` or picked (``run_ids``), frozen now."""
    _require(actor, tenant.pk, "create evaluation sets")
    if agent.tenant_id != tenant.pk:
        raise Invalid(f"there is no agent {agent.slug!r} in this tenant.", field="agent")
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise Invalid("name must be 1 to 100 characters.", field="name")
    if EvaluationSet.objects.filter(tenant=tenant, name=name).exists():
        raise Invalid(f"this tenant already has an evaluation set named {name!r}; sets are frozen, choose another name.",
                      field="name")
    if run_ids is not None and filters:
        raise Invalid("give either filters or run_ids, not both.", field="run_ids")
    if run_ids is not None:
        ids, chosen_by = _picked(agent, run_ids), {"picked": len(run_ids)}
    else:
        ids, chosen_by = _filtered(agent, dict(filters or {})), dict(filters or {})
    if not ids:
        raise Invalid("no finished run matches: a set needs at least one run.", field="filters" if run_ids is None else "run_ids")
    row = EvaluationSet.objects.create(tenant=tenant, name=name, agent=agent, filters=chosen_by, description=description,
                                       created_by=actor.user)
    EvaluationSetRun.objects.bulk_create([EvaluationSetRun(tenant=tenant, evaluation_set=row, run_id=pk, position=i)
                                          for i, pk in enumerate(ids)])
    record_change(tenant=tenant, actor=actor, action="evaluation_set.created", target=row,
                  details={"name": name, "agent": agent.slug, "runs": len(ids), "chosen_by": chosen_by})
    return row


def _decimal(value: Any, name: str) -> Decimal | None:
    if value is None or value == "":
        return None
    try:
        parsed = Decimal(str(value))
    except InvalidOperation:
        parsed = Decimal(-1)
    if isinstance(value, bool) or not parsed.is_finite() or parsed <= 0:
        raise Invalid(f"{name} must be a positive amount like 0.50; got {value!r}.", field=name)
    return parsed


@transaction.atomic
def start_replay(*, tenant: Tenant, actor: Actor, evaluation_set: EvaluationSet, candidate: AgentVersion,
                 model_mode: str = ModelMode.RECORDED, miss_policy: str = MissPolicy.STOP, checks: list[Any] | None = None,
                 cost_cap: Any = None, concurrency: int | None = None) -> ReplayBatch:
    """Queue a replay of the set on ``candidate``; its shards run on the workers once this commits."""
    _require(actor, tenant.pk, "start replays")
    if evaluation_set.tenant_id != tenant.pk:
        raise Invalid("there is no such evaluation set in this tenant.", field="evaluation_set")
    if candidate.tenant_id != tenant.pk or candidate.agent_id != evaluation_set.agent_id:
        raise Invalid(f"the candidate must be a version of {evaluation_set.agent.slug!r}, the set's agent.", field="candidate")
    if model_mode not in ModelMode.values:
        raise Invalid(f"model_mode must be one of {', '.join(ModelMode.values)}; got {model_mode!r}.", field="model_mode")
    if miss_policy not in MissPolicy.values:
        raise Invalid(f"miss_policy must be one of {', '.join(MissPolicy.values)}; got {miss_policy!r}.", field="miss_policy")
    checks = list(diffs.DEFAULT_CHECKS) if checks is None else checks
    problems = diffs.check_errors(checks)
    if problems:
        raise Invalid(" ".join(problems), field="checks")
    cap = _decimal(cost_cap, "cost_cap")
    if model_mode == ModelMode.LIVE and cap is None:
        raise Invalid("a live replay calls the candidate's model and costs money: give cost_cap (e.g. 1.00).", field="cost_cap")
    width = concurrency if concurrency is not None else int(getattr(settings, "REPLAY_CONCURRENCY", 2))
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_CONCURRENCY:
        raise Invalid(f"concurrency must be from 1 to {MAX_CONCURRENCY}; got {width!r}.", field="concurrency")
    total = evaluation_set.members.count()
    batch = ReplayBatch.objects.create(tenant=tenant, evaluation_set=evaluation_set, candidate=candidate,
                                       model_mode=model_mode, miss_policy=miss_policy, checks=checks, cost_cap=cap,
                                       concurrency=width, total=total, created_by=actor.user)
    ReplayShard.objects.bulk_create([ReplayShard(batch=batch, shard=n, shards=width) for n in range(width)])
    record_change(tenant=tenant, actor=actor, action="replay.started", target=batch,
                  details={"evaluation_set": evaluation_set.name, "candidate": f"{candidate.agent.slug} v{candidate.number}",
                           "model_mode": model_mode, "miss_policy": miss_policy, "runs": total,
                           "cost_cap": str(cap) if cap is not None else None})
    transaction.on_commit(lambda: _enqueue(batch.pk, width))
    return batch


@transaction.atomic
def cancel_replay(*, tenant: Tenant, actor: Actor, batch: ReplayBatch) -> ReplayBatch:
    """Stop a queued or running batch: its shards stop before their next chunk (results so far are kept)."""
    _require(actor, tenant.pk, "cancel replays")
    if batch.tenant_id != tenant.pk:
        raise Invalid("there is no such replay in this tenant.", field="batch")
    batch = ReplayBatch.objects.select_for_update().get(pk=batch.pk)
    if batch.status in ENDED:
        raise Conflict(f"the replay has already ended ({batch.status}); only a queued or running replay can be cancelled.")
    judged = batch.passed_count + batch.failed_count
    batch.status, batch.finished_at = BatchStatus.CANCELLED, timezone.now()
    batch.pass_rate = round(batch.passed_count / judged, 4) if judged else None
    batch.save(update_fields=["status", "finished_at", "pass_rate"])
    record_change(tenant=tenant, actor=actor, action="replay.cancelled", target=batch,
                  details={"done": batch.done, "total": batch.total})
    return batch


def _enqueue(batch_id: Any, shards: int) -> None:
    from releases.tasks import replay_shard_task

    for shard in range(shards):
        replay_shard_task.delay(batch_id, shard, shards)


class LeaseLost(Exception):
    """This worker's lease on a shard expired and another took the shard over: stop without committing."""


def _lease_until() -> dt.datetime:
    return timezone.now() + dt.timedelta(seconds=settings.REPLAY_LEASE_SECONDS)


def _take_lease(batch_id: Any, shard: int, shards: int) -> tuple[int, str] | None:
    """The shard's lease for this worker, or None if another worker holds it or the shard has finished."""
    row, _ = ReplayShard.objects.get_or_create(batch_id=batch_id, shard=shard, defaults={"shards": shards})
    token, now = uuid.uuid4().hex, timezone.now()
    free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
    taken = ReplayShard.objects.filter(free, pk=row.pk, finished_at__isnull=True).update(
        lease_token=token, lease_expires_at=_lease_until())
    return (row.pk, token) if taken else None


def _renew(lease: tuple[int, str]) -> None:
    """Extend the lease, or raise LeaseLost if the sweeper gave the shard to another worker meanwhile."""
    if not ReplayShard.objects.filter(pk=lease[0], lease_token=lease[1]).update(lease_expires_at=_lease_until()):
        raise LeaseLost


def run_shard(batch_id: Any, shard: int, shards: int) -> None:
    """Replay the set's members at positions ≡ ``shard`` (mod ``shards``) in chunks: per chunk a fixed number of
    queries to read the recordings, one bulk insert of results and one update of the batch's counters.

    Leased: a duplicate message (the sweeper's, the broker's redelivery) finds the lease held and returns; a successor
    resumes after the last committed chunk; a chunk commits only while its worker still holds the lease."""
    batch = ReplayBatch.objects.select_related("tenant", "candidate__agent", "candidate__tenant", "evaluation_set").get(pk=batch_id)
    if batch.status in ENDED:
        return
    lease = _take_lease(batch_id, shard, shards)
    if lease is None:
        return
    ReplayBatch.objects.filter(pk=batch_id, status=BatchStatus.QUEUED).update(status=BatchStatus.RUNNING,
                                                                              started_at=timezone.now())
    done_ids = set(ReplayRun.objects.filter(batch_id=batch_id).values_list("source_run_id", flat=True))
    members = [(m.position, m.run_id) for m in EvaluationSetRun.objects.filter(evaluation_set_id=batch.evaluation_set_id)
               .only("position", "run_id").order_by("position") if m.position % shards == shard and m.run_id not in done_ids]
    try:
        candidate = Candidate.build(batch.candidate, model_mode=batch.model_mode, miss_policy=batch.miss_policy,
                                    batch_id=batch.pk)
    except Exception as exc:
        log.exception("replay batch %s: the candidate cannot run", batch_id)
        ReplayBatch.objects.filter(pk=batch_id).update(status=BatchStatus.FAILED, error=f"the candidate cannot run: {exc}",
                                                       finished_at=timezone.now())
        ReplayShard.objects.filter(pk=lease[0], lease_token=lease[1]).update(finished_at=timezone.now())
        return
    model = _live_model(batch) if batch.model_mode == ModelMode.LIVE else None
    try:
        for start in range(0, len(members), CHUNK):
            if start and ReplayBatch.objects.filter(pk=batch_id, status=BatchStatus.CANCELLED).exists():
                break  # cancelled: the chunks already replayed stay, the rest are never started
            chunk = members[start:start + CHUNK]
            _replay_chunk(batch, candidate, chunk, model, lease)
    except LeaseLost:
        log.warning("replay batch %s shard %s: the lease passed to another worker; this one stops", batch_id, shard)
        return
    ReplayShard.objects.filter(pk=lease[0], lease_token=lease[1]).update(finished_at=timezone.now(), lease_expires_at=None)
    _maybe_finish(batch_id)


def _live_model(batch: ReplayBatch) -> Any:
    from agents.model_clients import TenantModelClient, gateway_for

    probe = Run(tenant=batch.tenant, agent=batch.candidate.agent, version=batch.candidate)
    return TenantModelClient(gateway_for(probe), f"t{batch.tenant_id}", deltas=None)


def _replay_chunk(batch: ReplayBatch, candidate: Candidate, chunk: list[tuple[int, Any]], model: Any,
                  lease: tuple[int, str] | None = None) -> None:
    position = {run_id: pos for pos, run_id in chunk}
    recs = {r.run.pk: r for r in recording.load([run_id for _, run_id in chunk])}
    rows: list[ReplayRun] = []
    audits = []
    spent = Decimal(0)
    for _, run_id in chunk:
        rec = recs.get(run_id)
        row = ReplayRun(tenant_id=batch.tenant_id, batch=batch, source_run_id=run_id, position=position[run_id])
        rows.append(row)
        if rec is None or rec.problem:
            row.status, row.passed, row.regression = "skipped", None, False
            row.error = rec.problem if rec is not None else "the run is gone (deleted)"
            continue
        if model is not None and batch.cost_cap is not None:
            spent_now = ReplayBatch.objects.filter(pk=batch.pk).values_list("cost_spent", flat=True).first() or Decimal(0)
            if spent_now + spent >= batch.cost_cap:
                row.status, row.passed = "skipped", None
                row.error = f"the batch's cost cap ({batch.cost_cap}) was reached before this run"
                continue
        if lease is not None:
            _renew(lease)
        try:
            replayer = replay_flow if rec.nodes or rec.run.agent.kind == AgentKind.FLOW else replay
            result = replayer(candidate, rec, model=model)
        except Exception as exc:
            log.exception("replay batch %s: run %s failed to replay", batch.pk, run_id)
            row.status, row.passed, row.regression = "error", False, True
            row.error = f"{type(exc).__name__}: {exc}"[:2000]
            continue
        d = diffs.diff(rec, result)
        results = diffs.run_checks(batch.checks, d)
        row.diff, row.check_results = d, results  # its arguments masked below, once the chunk's tools are known
        row.passed = all(r["passed"] for r in results)
        row.regression = not row.passed
        row.live_tool_calls = result.live_tool_calls
        row.tokens = result.usage.input_tokens + result.usage.output_tokens
        row.cost = Decimal(str(round(result.usage.cost, 6))) if model is not None else Decimal(0)
        row.latency_ms = result.latency_ms
        spent += row.cost
        if result.audit is not None and len(result.audit):
            audits.append(result.audit)
    sensitive = sensitive_fields(batch.tenant_id, [r.diff for r in rows])
    for row in rows:
        row.diff = diffs.masked(row.diff, sensitive)
        row.error = mask_text(row.error)
    passed = sum(1 for r in rows if r.passed)
    failed = sum(1 for r in rows if r.passed is False)
    with transaction.atomic():
        if lease is not None:
            _renew(lease)  # fenced: a worker that lost its shard to the sweeper commits nothing (no double count)
        ReplayRun.objects.bulk_create(rows, ignore_conflicts=True)
        for audit in audits:
            audit.commit(batch.tenant_id)
        ReplayBatch.objects.filter(pk=batch.pk).update(done=F("done") + len(rows), passed_count=F("passed_count") + passed,
                                                       failed_count=F("failed_count") + failed,
                                                       cost_spent=F("cost_spent") + spent)
        transaction.on_commit(lambda: metrics.observe(batch.model_mode, rows))


def _maybe_finish(batch_id: Any) -> None:
    with transaction.atomic():
        batch = ReplayBatch.objects.select_for_update().get(pk=batch_id)
        if batch.status in ENDED or batch.done < batch.total:
            return
        judged = batch.passed_count + batch.failed_count
        batch.pass_rate = round(batch.passed_count / judged, 4) if judged else None
        batch.status, batch.finished_at = BatchStatus.FINISHED, timezone.now()
        batch.save(update_fields=["pass_rate", "status", "finished_at"])
        record_change(tenant=batch.tenant, actor=None, action="replay.finished", target=batch,
                      details={"pass_rate": batch.pass_rate, "passed": batch.passed_count, "failed": batch.failed_count,
                               "runs": batch.total, "cost_spent": str(batch.cost_spent)})


def sensitive_fields(tenant_id: int, diffs_: Iterable[Any]) -> dict[str, list[str]]:
    """The fields each tool these diffs name declares sensitive (``Tool.sensitive_fields``): one query."""
    names = set().union(*(diffs.tool_names(d) for d in diffs_))
    if not names:
        return {}
    rows = Tool.objects.filter(tenant_id=tenant_id, name__in=names).values_list("name", "sensitive_fields")
    return {name: [f for f in fields if isinstance(f, str)] if isinstance(fields, list) else [] for name, fields in rows}


def batch_report(batch: ReplayBatch, *, limit: int = 200) -> dict[str, Any]:
    """The batch's progress and results, regressions first (then the set's order). Every result's diff is shown
    masked, to every role (``diffs.masked``: results stored before their diffs were masked at rest are too)."""
    rows = list(batch.results.order_by("-regression", "position")[:limit])
    sensitive = sensitive_fields(batch.tenant_id, [r.diff for r in rows])
    changed: dict[str, int] = {}
    for keys in batch.results.values_list("diff__changed", flat=True):  # the lists only, not every diff's text
        for key in keys if isinstance(keys, list) else []:
            changed[key] = changed.get(key, 0) + 1
    return {
        "id": batch.pk, "status": batch.status, "evaluation_set": batch.evaluation_set_id,
        "candidate": {"agent": batch.candidate.agent.slug, "version": batch.candidate.number},
        "model_mode": batch.model_mode, "miss_policy": batch.miss_policy, "checks": batch.checks,
        "total": batch.total, "done": batch.done, "passed": batch.passed_count, "failed": batch.failed_count,
        "skipped": batch.done - batch.passed_count - batch.failed_count, "pass_rate": batch.pass_rate,
        "cost_cap": str(batch.cost_cap) if batch.cost_cap is not None else None, "cost_spent": str(batch.cost_spent),
        "changed": changed, "error": batch.error or None,
        "created_at": batch.created_at, "started_at": batch.started_at, "finished_at": batch.finished_at,
        "results": [{"source_run": str(r.source_run_id), "status": r.status, "passed": r.passed, "regression": r.regression,
                     "changed": (r.diff or {}).get("changed", []), "checks": r.check_results,
                     "diff": diffs.masked(r.diff, sensitive), "live_tool_calls": r.live_tool_calls, "tokens": r.tokens,
                     "cost": str(r.cost), "latency_ms": r.latency_ms, "error": mask_text(r.error) or None} for r in rows],
    }

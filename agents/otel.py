"""OpenTelemetry traces of runs, model calls and tool calls, built from committed trace events.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (and ``OTEL_SDK_DISABLED`` is not ``true``): then
the SDK is never imported and :func:`observe_committed` costs one check per step. On, it reads the
standard variables through the SDK: ``OTEL_SERVICE_NAME`` (default ``agentops-console``),
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_HEADERS`` / ``_TIMEOUT`` / ``_COMPRESSION``,
``OTEL_TRACES_SAMPLER`` and ``OTEL_BSP_*`` (spans leave through a BatchSpanProcessor and the OTLP/HTTP
exporter).

Why spans are made after the fact
---------------------------------
A run is not one call stack: its steps commit one by one, possibly in different worker processes, and
a paused run resumes hours later elsewhere. So, like ``agents.metrics``, the spans are derived from the
committed ``RunEvent`` rows of each step, in one place (``agents.store.publish_after_commit``), and
leave only when the step's transaction commits. Each span gets explicit start and end times (an event's
``at`` is when the call ended; its ``latency_ms`` says when it began) and ids derived from the run:

- trace id = the run's UUID (128 bits), so every step of a run lands in one trace;
- span id = the event's ``span_id`` (16 hex digits = 64 bits);
- the run's ``invoke_agent`` span is emitted when the run finishes, with the id of the ``run.started``
  event (``_root_span`` in the checkpoint), which is the parent the earlier steps' spans already named.

Spans follow the OpenTelemetry GenAI semantic conventions: ``invoke_agent <agent slug>``,
``chat <model>`` and ``execute_tool <tool>``. They carry names, ids, statuses, tokens and cost only:
never prompts, completions, tool arguments or results (events hold masked copies of those; traces get
nothing of them).

Every process (the ASGI server, each Celery worker process) builds its own tracer provider on first
use; the provider flushes at interpreter exit, and Celery prefork children flush on
``worker_process_shutdown`` (they leave through ``os._exit``, which skips ``atexit``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re
import threading
import uuid
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "agentops-console"
SCOPE = "agentops.runs"
#: Statuses after which a tool call counts as failed (the span's status is ERROR, ``error.type`` the status).
FAILED_TOOL_STATUSES = frozenset({"error", "timeout", "invalid", "egress_denied", "outcome_unknown"})
_SPAN_EVENTS = frozenset({"model.call", "model.error", "tool.call", "run.finished"})
_HEX16 = re.compile(r"^[0-9a-f]{16}$")

_lock = threading.Lock()
_decided = False
_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_configure_lock = threading.Lock()  # one provider per process, even when two threads commit their first step at once
#: The ids the next span gets (see ``EventIdGenerator`` in :func:`configure`); 0 = let the SDK pick one at random.
_next_trace_id: ContextVar[int] = ContextVar("agentops_otel_trace_id", default=0)
_next_span_id: ContextVar[int] = ContextVar("agentops_otel_span_id", default=0)


def enabled_by_environment() -> bool:
    return bool(settings.OTEL_EXPORTER_OTLP_ENDPOINT) and not settings.OTEL_SDK_DISABLED


# -- what the spans are: pure, from rows -------------------------------------------------------


@dataclass(frozen=True)
class SpanSpec:
    name: str
    kind: str  # "internal" | "client"
    trace_id: int
    span_id: int
    parent_id: int  # 0 = a root span
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # ``error.type``; non-empty = the span's status is ERROR


def trace_id_of(run_id: Any) -> int:
    return uuid.UUID(str(run_id)).int


def span_id_of(run_id: Any, event_span_id: str) -> int:
    """The event's own span id when it is 16 hex digits, else a stable 64-bit hash of it (never 0)."""
    text = (event_span_id or "").lower()
    if _HEX16.match(text) and int(text, 16):
        return int(text, 16)
    digest = hashlib.blake2b(f"{run_id}:{event_span_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def _ns(when: dt.datetime) -> int:
    return round(when.timestamp() * 1_000_000) * 1_000


def _window(at: dt.datetime, latency_ms: Any) -> tuple[int, int]:
    end = _ns(at)
    try:
        latency = max(float(latency_ms), 0.0)
    except (TypeError, ValueError):
        latency = 0.0
    return end - round(latency * 1_000_000), end


def _int(value: Any) -> int:
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float:
    try:
        return max(float(value), 0.0)
    except (TypeError, ValueError):
        return 0.0


def _text(value: Any, default: str = "unknown") -> str:
    return str(value)[:200] if value not in (None, "") else default


def _payload(row: Any) -> dict[str, Any]:
    return row.payload if isinstance(row.payload, dict) else {}


def _chat(run_id: Any, trace_id: int, row: Any, attempts: list[dict[str, Any]]) -> SpanSpec:
    payload = _payload(row)
    failed = row.type == "model.error"
    first = attempts[0] if attempts else {}
    last = attempts[-1] if attempts else {}
    response_model = _text(payload.get("model"))
    request_model = _text(first.get("target") or payload.get("model"))
    latency = payload.get("latency_ms") if not failed else sum(_float(a.get("latency_ms")) for a in attempts)
    start, end = _window(row.at, latency)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": request_model,
        "agentops.model.task": _text(payload.get("task")),
        "agentops.run.id": str(run_id),
    }
    if last.get("provider"):
        attributes["gen_ai.provider.name"] = _text(last["provider"])
    if len(attempts) > 1:
        attributes["agentops.model.attempts"] = len(attempts)
    if not failed:
        attributes.update({
            "gen_ai.response.model": response_model,
            "gen_ai.usage.input_tokens": _int(payload.get("input_tokens")),
            "gen_ai.usage.output_tokens": _int(payload.get("output_tokens")),
            "gen_ai.response.finish_reasons": [_text(payload.get("finish_reason"))],
            "agentops.cost": _float(payload.get("cost")),
        })
    return SpanSpec(
        name=f"chat {request_model}", kind="client", trace_id=trace_id, span_id=span_id_of(run_id, row.span_id),
        parent_id=span_id_of(run_id, row.parent_span_id) if row.parent_span_id else 0, start_ns=start, end_ns=end,
        attributes=attributes, error=_text(last.get("outcome"), "model_error") if failed else "",
    )


def _tool(run_id: Any, trace_id: int, row: Any) -> SpanSpec:
    payload = _payload(row)
    tool, status = _text(payload.get("tool")), _text(payload.get("status"))
    start, end = _window(row.at, payload.get("latency_ms"))
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": _text(payload.get("call_id")),
        "agentops.tool.status": status,
        "agentops.run.id": str(run_id),
    }
    return SpanSpec(
        name=f"execute_tool {tool}", kind="internal", trace_id=trace_id, span_id=span_id_of(run_id, row.span_id),
        parent_id=span_id_of(run_id, row.parent_span_id) if row.parent_span_id else 0, start_ns=start, end_ns=end,
        attributes=attributes, error=status if status in FAILED_TOOL_STATUSES else "",
    )


def _root(run: Any, agent: str, started: Any, finished: Any) -> SpanSpec:
    payload = _payload(finished)
    usage = run.usage if isinstance(getattr(run, "usage", None), dict) and run.usage else payload.get("usage") or {}
    reason = _text(payload.get("terminal_reason"), "error")
    starts = [t for t in (getattr(started, "at", None), getattr(run, "started_at", None)) if t is not None]
    start = min(starts) if starts else getattr(run, "created_at", None) or finished.at
    root = (run.state or {}).get("_root_span") if isinstance(getattr(run, "state", None), dict) else None
    root = root or getattr(started, "span_id", None) or f"run:{run.pk}"
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        "gen_ai.agent.id": str(run.agent_id),
        "gen_ai.conversation.id": str(run.session_id),
        "gen_ai.usage.input_tokens": _int(usage.get("input_tokens")),
        "gen_ai.usage.output_tokens": _int(usage.get("output_tokens")),
        "agentops.cost": _float(usage.get("cost")),
        "agentops.run.id": str(run.pk),
        "agentops.run.terminal_reason": reason,
        "agentops.run.steps": _int(getattr(run, "step", 0)),
        "agentops.agent.version_id": str(run.version_id),
        "agentops.tenant.id": str(run.tenant_id),
    }
    return SpanSpec(
        name=f"invoke_agent {agent}", kind="internal", trace_id=trace_id_of(run.pk), span_id=span_id_of(run.pk, root),
        parent_id=0, start_ns=min(_ns(start), _ns(finished.at)), end_ns=_ns(finished.at), attributes=attributes,
        error="error" if reason == "error" else "",
    )


def span_specs(run: Any, rows: Iterable[Any], agent: str = "") -> list[SpanSpec]:
    """The spans a step's committed rows close: one per model call, tool call, and the run when it finished."""
    rows = list(rows)
    trace_id = trace_id_of(run.pk)
    attempts: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.type == "model.attempt" and row.parent_span_id:
            attempts.setdefault(row.parent_span_id, []).append(_payload(row))
    started = next((r for r in rows if r.type == "run.started"), None)
    specs: list[SpanSpec] = []
    for row in rows:
        if row.type in ("model.call", "model.error"):
            specs.append(_chat(run.pk, trace_id, row, attempts.get(row.span_id, [])))
        elif row.type == "tool.call":
            specs.append(_tool(run.pk, trace_id, row))
        elif row.type == "run.finished":
            specs.append(_root(run, agent or "unknown", started, row))
    return specs


def _agent_slug(run: Any) -> str:
    """The run's agent slug: the loaded relation (a worker's run has it), else one query, once per finished run."""
    relation = getattr(type(run), "agent", None)
    if relation is not None and relation.is_cached(run):
        return str(run.agent.slug)
    from agents.models import Agent

    return str(Agent.objects.filter(pk=run.agent_id).values_list("slug", flat=True).first() or "unknown")


# -- the SDK, imported only when tracing is on ------------------------------------------------------


def configure(processor: SpanProcessor | None = None) -> TracerProvider:
    """Build this process's tracer provider (replacing any): ``processor`` or a BatchSpanProcessor to OTLP/HTTP.

    Called on first use when the environment turns tracing on; tests call it with their own processor.
    """
    global _decided, _tracer, _provider
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class EventIdGenerator(RandomIdGenerator):
        """Hands out the ids derived from the run and its events (set just before each span starts)."""

        def generate_span_id(self) -> int:
            return _next_span_id.get() or super().generate_span_id()

        def generate_trace_id(self) -> int:
            return _next_trace_id.get() or super().generate_trace_id()

    if processor is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        processor = BatchSpanProcessor(OTLPSpanExporter())
    resource = Resource.create({})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource, id_generator=EventIdGenerator())  # shuts down (flushes) at exit
    provider.add_span_processor(processor)
    with _lock:
        previous = _provider
        _provider, _tracer, _decided = provider, provider.get_tracer(SCOPE), True
    if previous is not None:
        previous.shutdown()
    _flush_when_a_celery_child_exits()
    return provider


def _flush_when_a_celery_child_exits() -> None:
    from celery.signals import worker_process_shutdown

    worker_process_shutdown.connect(_shutdown_on_signal, weak=False, dispatch_uid="agentops-otel-flush")


def _shutdown_on_signal(**_: Any) -> None:
    shutdown()


def shutdown() -> None:
    """Export what is queued and stop; the next step decides again from the environment (tests use this)."""
    global _decided, _tracer, _provider
    with _lock:
        provider, _provider, _tracer, _decided = _provider, None, None, False
    if provider is not None:
        provider.shutdown()


def _current_tracer() -> Tracer | None:
    """This process's tracer, built on first use if the environment asks for one; None when tracing is off."""
    global _decided
    with _configure_lock:
        if _decided:
            return _tracer
        if not enabled_by_environment():
            with _lock:
                _decided = True
            return None
        try:
            configure()
        except Exception:
            log.warning("OpenTelemetry tracing is configured but could not start; runs are not traced", exc_info=True)
            with _lock:
                _decided = True
        return _tracer


def _emit(tracer: Tracer, specs: list[SpanSpec]) -> None:
    from opentelemetry import context, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

    kinds = {"client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
    sampler = getattr(tracer, "sampler", None)
    for spec in specs:
        parent = context.Context()  # empty: a root span, whatever span is current in this thread
        if spec.parent_id:
            # The parent was (or will be) sampled as a root of this trace id: ask the sampler the same question, so
            # that a ratio sampler (OTEL_TRACES_SAMPLER) keeps or drops a run's spans together, in every process.
            sampled = sampler is None or sampler.should_sample(parent, spec.trace_id, "invoke_agent").decision.is_sampled()
            flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
            remote = SpanContext(spec.trace_id, spec.parent_id, is_remote=True, trace_flags=flags)
            parent = trace.set_span_in_context(NonRecordingSpan(remote), parent)
        trace_token, span_token = _next_trace_id.set(spec.trace_id), _next_span_id.set(spec.span_id)
        try:
            span = tracer.start_span(spec.name, context=parent, kind=kinds[spec.kind], attributes=spec.attributes,
                                     start_time=spec.start_ns)
        finally:
            _next_span_id.reset(span_token)
            _next_trace_id.reset(trace_token)
        if spec.error:
            span.set_attribute("error.type", spec.error)
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=max(spec.end_ns, spec.start_ns))


def observe_committed(run: Any, rows: list[Any]) -> None:
    """Emit the spans a step's events close, once its transaction commits. Never raises into the caller."""
    tracer = _tracer if _decided else _current_tracer()
    if tracer is None:
        return
    try:
        if not any(r.type in _SPAN_EVENTS for r in rows):
            return
        agent = _agent_slug(run) if any(r.type == "run.finished" for r in rows) else ""
        specs = span_specs(run, rows, agent)
    except Exception:
        log.warning("could not derive spans from run %s's events", getattr(run, "pk", "?"), exc_info=True)
        return

    def emit() -> None:
        try:
            _emit(tracer, specs)
        except Exception:
            log.warning("could not emit spans", exc_info=True)

    transaction.on_commit(emit)

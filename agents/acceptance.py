"""Accepting a run exactly once (issue #13): the ``Idempotency-Key`` and the run row as the outbox.

A run is accepted when its row commits, and from then on the client gets a 202 with the run, whatever the broker does:

- **The run row is the outbox.** The task is enqueued after the commit, best effort (:func:`deliver`): a broker that is
  down is logged (naming the run) and counted (``agentops_run_enqueue_failures_total``), never raised into the request.
  The run stays ``queued`` and the sweeper (``agents/sweeper.py``) enqueues it once it has been queued for
  ``SWEEP_QUEUED_AFTER_SECONDS``; a duplicate delivery is harmless, the run's lease decides who executes it.
- **A retry does not make a second run.** ``POST /api/v1/runs`` with ``Idempotency-Key: <key>`` stores the key on the
  run, with an HMAC of the canonical request body (:func:`request_digest`). Keys are per tenant
  (``UniqueConstraint(tenant, idempotency_key)``) and kept as long as the run. The same key with the same body returns
  the run it created (``Idempotent-Replayed: true``); with a different body it is refused (:class:`KeyReused`, a 422).
  Two requests racing with one key create one run: the loser's insert hits the unique constraint (or, continuing one
  session, waits for the winner's session lock and then finds its active run), its transaction is rolled back, and
  it returns the winner's run.
"""

from __future__ import annotations

import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError
from django.utils.crypto import salted_hmac
from prometheus_client import Counter

from agents import services
from agents.models import Agent, AgentVersion, Run, Session
from core.errors import DomainError
from core.outages import dependency_down
from tenants.scoping import Actor

log = logging.getLogger(__name__)

IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_MAX_LENGTH = 255
KEY_RULE = f"1 to {KEY_MAX_LENGTH} printable ASCII characters (space to ~), e.g. a UUID"
KEY_SCHEMA = {"type": "string", "minLength": 1, "maxLength": KEY_MAX_LENGTH, "pattern": "^[ -~]+$"}

ENQUEUE_FAILURES = Counter(
    "agentops_run_enqueue_failures",
    "Runs whose task could not be enqueued after their row committed (broker down); the sweeper delivers them later.",
)

_DIGEST_SALT = "agents.acceptance.request_digest"


class KeyInvalid(ValueError):
    """The ``Idempotency-Key`` header is not a key this API accepts (a 400 naming the header)."""


class KeyReused(DomainError):
    """The key was first used with a different request body (a 422)."""

    code = "idempotency_key_reused"
    status = 422


@dataclass(frozen=True)
class Accepted:
    run: Run
    replayed: bool  # True: an earlier request with this key created the run; nothing new was created


def parse_key(raw: str | None) -> str:
    """The header's key ("" when the header is absent), or :class:`KeyInvalid` saying what is expected."""
    if raw is None:
        return ""
    if not 1 <= len(raw) <= KEY_MAX_LENGTH or not all(" " <= char <= "~" for char in raw):
        shown = f"{len(raw)} characters" if len(raw) > KEY_MAX_LENGTH or not raw else "non-printable or non-ASCII characters"
        raise KeyInvalid(f"Must be {KEY_RULE}; got {shown}. Send the same key on every retry of one request.")
    return raw


def canonical_body(*, agent: str, text: str, session: Any, facts: dict[str, Any] | None) -> str:
    """The validated request as sorted-keys JSON: what "the same body" means."""
    body = {"agent": agent, "input": text, "session": str(session) if session else None, "facts": facts or {}}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def request_digest(canonical: str, *, secret: str | None = None) -> str:
    """An HMAC-SHA256 of the canonical body (keyed, so a stored digest cannot confirm a guessed input)."""
    return salted_hmac(_DIGEST_SALT, canonical, secret=secret, algorithm="sha256").hexdigest()


def _same_body(stored: str, canonical: str) -> bool:
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]  # a rotated key still matches
    return any(hmac.compare_digest(stored, request_digest(canonical, secret=secret)) for secret in secrets)


def _earlier(tenant_id: int, key: str, canonical: str) -> Run | None:
    """The run this tenant created with ``key``, if any; :class:`KeyReused` if it came from a different body."""
    run = Run.objects.filter(tenant_id=tenant_id, idempotency_key=key).first()
    if run is not None and not _same_body(run.request_digest, canonical):
        raise KeyReused(
            f"The {IDEMPOTENCY_HEADER} {key!r} was already used in this tenant, with a different request body: this "
            "body (agent, input, session or facts) differs from the first request's. Send the first request's body "
            "again to get its run, or use a new key for a new run."
        )
    return run


def accept_run(*, actor: Actor, agent: Agent, text: str, session: Session | None = None,
               facts: dict[str, Any] | None = None, idempotency_key: str = "", version: AgentVersion | None = None,
               playground: bool = False, enqueue: bool = True) -> Accepted:
    """Start a run, or return the one an earlier request with the same key started (see the module's docstring).

    Raises ``services.RunRefused`` (the run cannot start) and :class:`KeyReused`. Call outside a transaction, or
    inside one that may roll back to a savepoint (``start_run`` is atomic: a lost race rolls back only its own work).
    ``enqueue=False``: a new run is not enqueued; the caller delivers it (:func:`deliver`, see ``services.start_run``).
    """
    if not idempotency_key:
        return Accepted(services.start_run(actor=actor, agent=agent, text=text, session=session, facts=facts,
                                           version=version, playground=playground, enqueue=enqueue), False)
    canonical = canonical_body(agent=agent.slug, text=text, session=session.pk if session else None, facts=facts)
    earlier = _earlier(agent.tenant_id, idempotency_key, canonical)
    if earlier is not None:
        return Accepted(earlier, True)
    try:
        run = services.start_run(actor=actor, agent=agent, text=text, session=session, facts=facts,
                                 idempotency_key=idempotency_key, request_digest=request_digest(canonical),
                                 version=version, playground=playground, enqueue=enqueue)
    except (IntegrityError, services.RunRefused):
        # A concurrent request with this key committed first: the unique constraint refused our row, or (one session)
        # we waited for its session lock and then found its run in progress. Either way its run is the answer.
        earlier = _earlier(agent.tenant_id, idempotency_key, canonical)
        if earlier is None:
            raise
        return Accepted(earlier, True)
    return Accepted(run, False)


def deliver(run_id: Any) -> bool:
    """Put the run on the queue now; False (logged, counted) if the broker refused. Never raises.

    The run's row is committed already: it is accepted, and a run left ``queued`` is the sweeper's to deliver.
    """
    from agents.tasks import execute_run_task

    try:
        execute_run_task.delay(str(run_id))
    except Exception as exc:
        ENQUEUE_FAILURES.inc()
        down = dependency_down(exc)
        log.warning(
            "run %s: accepted but not enqueued (%s: %s); it stays queued and the sweeper enqueues it after "
            "SWEEP_QUEUED_AFTER_SECONDS (%ss)", run_id, type(exc).__name__, exc, settings.SWEEP_QUEUED_AFTER_SECONDS,
            exc_info=down is None,  # an outage is expected and said in one line; anything else gets its traceback
        )
        return False
    return True

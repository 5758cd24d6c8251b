"""Property-based fuzzing of the OpenAPI schema (schemathesis): no input is a 5xx; every response is documented.

Every operation of ``/api/schema/`` gets schema-conforming (positive) and schema-violating (negative) requests, sent
in process (WSGI, same database transaction) with an operator's API key of a seeded tenant. Bounded: a fixed number
of examples per operation and mode, derandomized (the same requests every run), and an overall time budget after
which the remaining examples are not sent (a warning names the operations cut short).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import override_settings
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from agents import services as run_services
from audit.models import ConfigChange
from marketplace import services as marketplace_services
from tenants.scoping import actor_for_api_key
from tests.factories import make_world

pytestmark = pytest.mark.django_db

EXAMPLES_PER_OPERATION = 25  # per generation mode
TIME_BUDGET_SECONDS = 150.0
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
UNTHROTTLED = {"api": "100000/min", "run_create": "100000/min"}


@contextmanager
def _keeping_the_test_connection() -> Iterator[None]:
    """Requests served in process must not close the test's database connection (Django's test client does the same)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


def test_the_api_fuzzes_clean_against_its_own_schema() -> None:
    from django.conf import settings as django_settings

    world = make_world()
    auth = {"Authorization": f"Bearer {world.raw_key}"}
    known = _seed(world)
    rest = {**django_settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": UNTHROTTLED}
    started = time.monotonic()
    failures: dict[str, int] = {}
    cut_short: list[str] = []

    with override_settings(REST_FRAMEWORK=rest), _keeping_the_test_connection():
        schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())
        for operation in _operations(schema):
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                sent, skipped = _fuzz(operation, mode, auth, known, started, failures)
                if skipped:
                    cut_short.append(f"{operation.label} ({mode.value}: {sent} sent, {skipped} not)")

    assert not failures, f"{len(failures)} distinct failures:\n" + "\n\n".join(f"({n}x) {f}" for f, n in failures.items())
    if cut_short:
        warnings.warn(f"fuzz time budget ({TIME_BUDGET_SECONDS:.0f} s) reached; cut short: {', '.join(cut_short)}", stacklevel=1)


def _seed(world: Any) -> dict[str, dict[str, Any]]:
    """Objects of the world's tenant for the operations that address one, by path prefix: a run, its session, an install, a change."""
    actor = actor_for_api_key(world.key)
    run = run_services.start_run(actor=actor, agent=world.agent, text="where is order O202411280001?")
    install = marketplace_services.install_plugin(tenant=world.tenant, plugin_key="order-desk", actor=actor, config=None)
    change = ConfigChange.objects.filter(tenant=world.tenant).order_by("pk").first()
    agent = {"slug": world.agent.slug, "number": world.version.number}
    return {
        "/api/v1/agents/": agent, "/api/v1/releases/": agent, "/api/v1/plugins/": {"key": "order-desk"},
        "/api/v1/tools/": {"id": "query_order"}, "/api/v1/runs/": {"id": str(run.pk)}, "/api/v1/sessions/": {"id": str(run.session_id)},
        "/api/v1/plugin-installs/": {"id": install.pk}, "/api/v1/audit/changes/": {"id": change.pk if change else 1},
    }


def _fuzz(operation: Any, mode: GenerationMode, auth: dict[str, str], known: dict[str, dict[str, Any]], started: float,
          failures: dict[str, int]) -> tuple[int, int]:
    """Send up to EXAMPLES_PER_OPERATION cases of ``operation``; record what fails. How many were sent and not (budget)."""
    count = skipped = 0
    path_names = {p.name for p in operation.path_parameters}
    real = next((values for prefix, values in known.items() if operation.path.startswith(prefix)), {})
    # Half the positive cases address a real object (so the handlers run), half a random one (so 404s are checked).
    strategies = [operation.as_strategy(generation_mode=mode)]
    # Not a real run's event stream: it lasts until the run ends, and here no worker runs it (nor can WSGI serve an async
    # stream); its errors are fuzzed with random ids, and tests/integration/test_run_stream.py serves it over uvicorn.
    streams = operation.path.endswith("/stream")
    if mode is GenerationMode.POSITIVE and path_names and path_names <= real.keys() and not streams:
        strategies.append(operation.as_strategy(generation_mode=mode, path_parameters={n: real[n] for n in path_names}))

    examples = EXAMPLES_PER_OPERATION // len(strategies)
    for strategy in strategies:
        if time.monotonic() - started > TIME_BUDGET_SECONDS:
            skipped += examples  # not generated either: past the budget nothing is sent, and generating costs as much
            continue

        @given(case=strategy)
        @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            nonlocal count, skipped
            if time.monotonic() - started > TIME_BUDGET_SECONDS:
                skipped += 1
                return
            count += 1
            try:
                case.call_and_validate(headers=auth, checks=CHECKS)
            except (AssertionError, BaseExceptionGroup) as exc:  # a schemathesis Failure, or a FailureGroup of several
                found = exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,)
                for failure in found:
                    lines = [line for line in str(getattr(failure, "message", failure)).splitlines() if line.strip()]
                    where = next((line for line in lines if line.startswith(("Schema at", "Received"))), lines[0] if lines else "")
                    key = f"{operation.label} [{mode.value}] {getattr(failure, 'title', type(failure).__name__)}: {where}"
                    failures[key] = failures.get(key, 0) + 1
            except Exception as exc:  # an unhandled server-side exception surfaces here in process
                key = f"{operation.label} [{mode.value}]: {type(exc).__name__}: {exc}"
                failures[key] = failures.get(key, 0) + 1

        run()
    return count, skipped


"""Issue #14: a served process and a worker freeze their startup heap (config/heap.py), so the cyclic garbage
collector stops walking the ~200,000 objects of Django, DRF, Celery and the project on every full collection.

Each check runs in a fresh interpreter: freezing is for the whole process, and this test process must keep its own
collector as it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}  # the embedded mode
    env.update(DEBUG="false", HTTPS_ONLY="false", SECRET_KEY="test-only-secret-key-0123456789abcdefghij",
               DJANGO_SETTINGS_MODULE="config.settings")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.split()


def test_freezing_keeps_what_is_alive_and_still_collects_what_comes_after() -> None:
    frozen, cycle_gone, young_cycle_gone = run_python(
        "import gc, weakref\n"
        "from config.heap import freeze_startup_heap\n"
        "class Node: pass\n"
        "old = Node(); old.me = old; old_ref = weakref.ref(old); del old\n"  # garbage made while starting
        "frozen = freeze_startup_heap()\n"
        "young = Node(); young.me = young; young_ref = weakref.ref(young); del young\n"  # garbage made by a request
        "gc.collect()\n"
        "print(frozen, old_ref() is None, young_ref() is None)\n"
    )
    assert int(frozen) > 1000  # the interpreter and the modules imported so far
    assert cycle_gone == "True"  # collected before the freeze, not kept forever
    assert young_cycle_gone == "True"  # what comes after the freeze is collected as before


def test_the_served_application_is_the_asgi_app_with_the_heap_frozen() -> None:
    before, after, same = run_python(
        "import gc\n"
        "import config.asgi as asgi\n"
        "before = gc.get_freeze_count()\n"
        "app = asgi.served_application()\n"
        "print(before, gc.get_freeze_count(), app is asgi.application)\n"
    )
    assert before == "0"  # importing the module (as tests do) freezes nothing
    assert int(after) > 100_000  # Django, DRF, Channels, the project: the server's code
    assert same == "True"


def test_a_ready_worker_freezes_its_heap() -> None:
    before, after = run_python(
        "import gc\n"
        "import django; django.setup()\n"
        "from celery.signals import worker_ready\n"
        "import config.celery\n"
        "before = gc.get_freeze_count()\n"
        "worker_ready.send(sender=None)\n"
        "print(before, gc.get_freeze_count())\n"
    )
    assert before == "0"
    assert int(after) > 100_000


def test_serve_runs_uvicorn_with_the_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    import uvicorn

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: calls.append((args, kwargs)))
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # serve sets SIGTERM's handler: not in this process
    call_command("serve", "--no-worker", "--port", "8765")
    [(args, kwargs)] = calls
    assert args == ("config.asgi:served_application",)
    assert kwargs["factory"] is True
    assert (kwargs["host"], kwargs["port"], kwargs["lifespan"]) == (settings.SERVE_HOST, 8765, "off")

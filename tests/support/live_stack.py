"""The live stack: a real ASGI server (uvicorn) and a real Celery worker, on the test database.

Production mode (DATABASE_URL and REDIS_URL set): PostgreSQL, Redis, and ``celery -A config
worker`` as its own process. Embedded mode (neither set): SQLite and the server's in-process
worker. Tests talk to it over HTTP and websockets only, and read the database to check.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _database_url() -> str:
    from django.db import connection

    db = connection.settings_dict  # after django_db_setup: the test database
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


@dataclass
class LiveStack:
    base_url: str
    ws_url: str
    mode: str
    env: dict[str, str]
    logdir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=20)

    def wait_for_run(self, key: str, run_id: str, timeout: float = 30, statuses: tuple[str, ...] = ("finished",)) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.client(key) as http:
            while True:
                body = http.get(f"/api/v1/runs/{run_id}").json()
                if body["status"] in statuses:
                    return body
                if time.monotonic() > deadline:
                    raise AssertionError(f"run {run_id} still {body['status']} after {timeout}s; logs in {self.logdir}")
                time.sleep(0.1)

    def slow_calls_begun(self) -> int:
        """How many calls of the slow test tools this stack's processes have begun (tests/support/slow_tools.py)."""
        marks = Path(self.env["TEST_SLOW_TOOL_MARKS"])
        return sum(1 for _ in marks.iterdir()) if marks.is_dir() else 0

    def log_lines(self, *needles: str, limit: int = 40) -> str:
        """The last ``limit`` lines of this stack's process logs that hold one of ``needles`` (for a failure message)."""
        found: list[str] = []
        for path in sorted(self.logdir.glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                if any(needle in line for needle in needles):
                    found.append(f"{path.stem}: {line}")
        return "\n".join(found[-limit:])

    def start_worker(self) -> subprocess.Popen[bytes]:
        workers = sum(1 for name in self.processes if name.startswith("worker"))
        name = f"worker-{workers + 1}" if workers else "worker"  # one log file and one entry per process
        proc = self._spawn(name, [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=threads",
                                      "--concurrency=4", "-Q", self.env["AGENTOPS_QUEUE"], "--without-gossip", "--without-mingle",
                                      "--loglevel=INFO", "-n", f"test-{time.monotonic_ns()}@%h"])
        return proc

    def kill_executor(self) -> None:
        """SIGKILL whatever executes runs: the worker processes (production) or the server and its embedded worker."""
        kind = "worker" if self.mode == "production" else "server"
        doomed = [p for name, p in self.processes.items() if name.startswith(kind) and p.poll() is None]
        assert doomed, f"no live {kind} process to kill"
        for proc in doomed:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(argv, cwd=ROOT, env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.processes[name] = proc
        return proc

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _wait_healthy(stack: LiveStack, timeout: float = 45) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for name, proc in stack.processes.items():
            if proc.poll() is not None:
                log = (stack.logdir / f"{name}.log").read_text()[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode} during start-up:\n{log}")
        try:
            response = httpx.get(f"{stack.base_url}/healthz", timeout=3)
            if response.status_code == 200 and response.json().get("status") == "ok":  # "degraded": no worker seen yet
                return
            last = response.text
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise RuntimeError(f"the live stack did not become healthy in {timeout}s: {last}")


def make_live_stack(extra_env: dict[str, str] | None = None, server_env: dict[str, str] | None = None) -> LiveStack:
    """Start a server (and in production mode a worker) whose processes get ``extra_env`` too, the server also
    ``server_env``; the caller stops it."""
    production = bool(os.environ.get("REDIS_URL"))
    if os.environ.get("CI", "").lower() == "true" and production and "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        raise RuntimeError("CI runs the live stack on PostgreSQL: set DATABASE_URL to a postgres:// URL.")
    port = _free_port()
    logdir = Path(tempfile.mkdtemp(prefix="agentops-live-"))
    env = dict(os.environ)
    env.update(
        DATABASE_URL=_database_url(), DEBUG="false", HTTPS_ONLY="false", SECRET_KEY=settings.SECRET_KEY, AGENTOPS_VAR_DIR=str(logdir),
        PYTHONUNBUFFERED="1", RUN_LEASE_SECONDS=os.environ.get("TEST_RUN_LEASE_SECONDS", "8"),
        # Test-only tools (slow ones, for durability tests), loaded like an operator's site-specific tools.
        AGENTOPS_EXTRA_TOOL_MODULES="tests.support.slow_tools",
        # Its own queue: other stacks on the same Redis (another test module's, another test run's) never take its runs.
        AGENTOPS_QUEUE=f"agentops-test-{port}",
        TEST_SLOW_TOOL_MARKS=str(logdir / "slow-calls"),
    )
    env.update(extra_env or {})
    if not production:
        env.pop("REDIS_URL", None)
    stack = LiveStack(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", "production" if production else "embedded", env, logdir)
    argv = [sys.executable, "manage.py", "serve", "--port", str(port)]
    if production:
        argv.append("--no-worker")
        stack.start_worker()
    stack._spawn("server", argv, server_env)
    try:
        _wait_healthy(stack)
    except BaseException:
        stack.stop()
        raise
    return stack


def replace_executor(victim: LiveStack, own: list[LiveStack], extra_env: dict[str, str] | None = None) -> LiveStack:
    """After ``kill_executor``: a new worker on the same stack (production), or a new server on the same database
    (embedded, where the worker lived in the killed server). New stacks are added to ``own`` for the caller to stop."""
    if victim.mode == "production":
        victim.start_worker()
        return victim
    successor = make_live_stack(extra_env)
    own.append(successor)
    return successor


@pytest.fixture(scope="session")
def live_stack(django_db_setup: Any, django_db_blocker: Any) -> Iterator[LiveStack]:
    stack = make_live_stack()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def unblocked_db(django_db_blocker: Any) -> Iterator[None]:
    """Direct database access outside a test transaction: rows are committed, the live stack sees them."""
    with django_db_blocker.unblock():
        yield

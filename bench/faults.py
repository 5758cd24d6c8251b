"""Fault injection against a real production-mode stack of its own: worker kills, a Redis outage, a PostgreSQL restart.

    .venv/bin/python bench/faults.py [--runs 96] [--kills 32] [--seed 1] [--keep]

It never touches the machine's shared PostgreSQL (127.0.0.1:5432) or Redis (127.0.0.1:6379): it starts its own
``redis-server`` (free port, no persistence, in a temp dir) and its own PostgreSQL cluster (``initdb`` + ``pg_ctl`` in
a temp dir, free port, trust auth on 127.0.0.1; as the ``postgres`` user through ``runuser``/``su`` when run as root,
since initdb and postgres refuse root). Only if no own cluster can be started does it fall back to a dedicated
database on the shared server (``BENCH_SHARED_PG``, default ``postgres://postgres@127.0.0.1:5432``), dropped at the
end, and then it skips the PostgreSQL-restart phase and says so.

On them it starts the console in production mode (``migrate``, ``seed_demo``, ``manage.py serve --no-worker``, two
``celery worker`` processes and one ``celery beat``, short lease and sweep settings) and drives it over HTTP on
127.0.0.1 only, with the demo tenant's API key (fixed through ``DEMO_API_KEY``) and an approver key it creates:

1. worker kills: ``--runs`` runs of the demo agent (deterministic planner; a quarter of them refunds, which wait for
   an approval and then call the write tool ``refund_order``), while a random worker is SIGKILLed ``--kills`` times
   at random moments and restarted;
2. Redis outage: its redis-server stopped for ~5 s (and so wiped: no persistence) while runs are created at a
   steady rate and read;
3. PostgreSQL restart: ``pg_ctl stop -m fast``, 5 s, ``pg_ctl start`` while runs are in flight, created and read;
4. idempotency: every create of phases 2 and 3 carries an ``Idempotency-Key`` and is retried with it on any
   non-2xx (bounded); at the end no key may have made two runs.

Then, from the database (psycopg, plain SQL): accepted runs, finished runs by terminal reason, runs still not
finished after a bounded wait (lost), RunEvent ``seq`` gaps and duplicates, ToolCallAudit rows per (run, step,
tool, arguments) of write tools (duplicate side effects), runs needing attention; and the HTTP statuses per phase
(500s highlighted). A table on stdout and ``bench/results/faults.json``. It measures whatever the code does.

Every process it starts is stopped by its PID at the end (also on Ctrl-C or an error); the temp dir is removed
unless ``--keep`` or something failed (its logs are then kept and named).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import pwd
import random
import secrets
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "faults.json"

REDIS_SERVER = "/usr/bin/redis-server"
INITDB = "/usr/local/bin/initdb"
PG_CTL = "/usr/local/bin/pg_ctl"
SHARED_PG = os.environ.get("BENCH_SHARED_PG", "postgres://postgres@127.0.0.1:5432")
DB_NAME = "agentops_faults"

#: Short recovery settings for the stack (each is a documented setting; RUN_LEASE_SECONDS is at its minimum).
STACK_SETTINGS = {
    "RUN_LEASE_SECONDS": "5",
    "SWEEP_INTERVAL_SECONDS": "1",
    "SWEEP_QUEUED_AFTER_SECONDS": "3",
    # The throttles stay on (their counters live in Redis, so the outage goes through them), but never trip.
    "API_THROTTLE_RATE": "100000/min",
    "RUN_CREATE_THROTTLE_RATE": "100000/min",
}
WORKER_CONCURRENCY = 4
OUTAGE_SECONDS = 5.0
CREATE_RATE_PER_S = 3.0  # steady creates during phases 2 and 3
MAX_CREATE_ATTEMPTS = 8  # phases 2 and 3: one create, retried with its Idempotency-Key on any non-2xx
HTTP_TIMEOUT = 15.0

PROMPTS = [
    ("logistics", "where is order O202411280001?"),
    ("order", "what is in order O202411280002?"),
    ("totals", "how much do orders O202411280001 and O202411280002 cost together?"),
    ("refund", "refund 1.00 for order O202411280002 because the glass cup broke"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def stop_process(proc: subprocess.Popen[bytes], *, group: bool = True, timeout: float = 10.0) -> None:
    """SIGTERM a process this script started (its own process group), then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue


# --- Redis of its own ------------------------------------------------------------------------------------------------


class OwnRedis:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "redis"
        self.dir.mkdir()
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def start(self) -> None:
        self.starts += 1
        logfile = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir)],
            stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.dir,
        )
        deadline = time.monotonic() + 15
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}; see {self.dir / 'redis.log'}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


# --- PostgreSQL of its own (or a dedicated database on the shared server) ---------------------------------------------


class OwnPostgres:
    """``initdb`` + ``pg_ctl`` in a temp dir; as the ``postgres`` user when this runs as root."""

    restartable = True

    def __init__(self, workdir: Path) -> None:
        self.base = workdir / "pg"
        self.data = self.base / "data"
        self.port = free_port()
        self.wrapper: list[str] = []
        self.how = "as the current user"
        self.log = self.base / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{DB_NAME}"

    @property
    def admin_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _as_owner(self, argv: list[str]) -> list[str]:
        if not self.wrapper:
            return argv
        if self.wrapper[0] == "su":
            return [*self.wrapper, shlex.join(argv)]
        return [*self.wrapper, *argv]

    def _run(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
        # Output to a file, never a pipe: the postmaster pg_ctl starts inherits it and would hold a pipe open.
        with open(self.base / "pg_ctl.out", "ab") as out:
            return subprocess.run(self._as_owner(argv), stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                                  check=False, cwd=self.base)

    def setup(self) -> None:
        self.base.mkdir()
        if os.geteuid() == 0:
            # initdb and postgres refuse root: the cluster belongs to the postgres user (runuser, else su).
            owner = pwd.getpwnam("postgres")  # KeyError when there is no such user: the caller falls back
            os.chmod(self.base.parent, 0o711)  # the postgres user may traverse the temp dir, not list it
            os.chown(self.base, owner.pw_uid, owner.pw_gid)
            candidates = []
            if shutil.which("runuser"):
                candidates.append((["runuser", "-u", "postgres", "--"], "as postgres via runuser"))
            if shutil.which("su"):
                candidates.append((["su", "postgres", "-s", "/bin/sh", "-c"], "as postgres via su"))
            for wrapper, how in candidates:
                self.wrapper, self.how = wrapper, how
                if self._run(["/usr/bin/env", "true"]).returncode == 0:
                    break
            else:
                raise RuntimeError("running as root, and neither runuser nor su can run a command as postgres")
        done = self._run([INITDB, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}); see {self.base / 'pg_ctl.out'}")
        self.start()
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB_NAME}")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1"
        done = self._run([PG_CTL, "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start"])
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed ({done.returncode}); see {self.log}")

    def stop(self, mode: str = "fast") -> None:
        if not (self.data / "postmaster.pid").exists():
            return
        done = self._run([PG_CTL, "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])
        if done.returncode != 0:
            self.kill()

    def kill(self) -> None:
        """Last resort: SIGQUIT (immediate shutdown) the postmaster of this cluster, by the PID in its own pid file."""
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGQUIT)

    def teardown(self) -> None:
        self.stop()


class SharedPostgres:
    """The fallback: a dedicated database on the shared server, dropped at the end. Never restarted."""

    restartable = False
    how = "fallback: a dedicated database on the shared server"

    def __init__(self) -> None:
        self.name = f"agentops_faults_{os.getpid()}"

    @property
    def url(self) -> str:
        return f"{SHARED_PG}/{self.name}"

    def setup(self) -> None:
        with psycopg.connect(f"{SHARED_PG}/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {self.name}")

    def teardown(self) -> None:
        with contextlib.suppress(psycopg.Error), psycopg.connect(f"{SHARED_PG}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


# --- The console ------------------------------------------------------------------------------------------------------


class Console:
    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.logs = workdir / "logs"
        self.logs.mkdir()
        self.env = env
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.retired: list[subprocess.Popen[bytes]] = []
        self.incarnations: Counter[str] = Counter()
        self.lock = threading.RLock()  # the supervisor and the killer never act on a process at the same time
        self.killed: set[str] = set()  # SIGKILLed by the bench and not restarted yet: not the supervisor's business

    def manage(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        (self.logs / f"manage-{args[0]}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
        return done.stdout

    def spawn(self, name: str) -> subprocess.Popen[bytes]:
        self.incarnations[name] += 1
        if name == "server":
            argv = [sys.executable, "manage.py", "serve", "--no-worker", "--port", str(self.port)]
        elif name == "beat":
            argv = [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel=INFO",
                    "-s", str(self.logs.parent / "celerybeat-schedule")]
        else:
            argv = [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=threads",
                    f"--concurrency={WORKER_CONCURRENCY}", "-Q", self.env["AGENTOPS_QUEUE"], "--without-gossip",
                    "--without-mingle", "--loglevel=INFO", "-n", f"faults-{name}-{self.incarnations[name]}@%h"]
        logfile = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True)
        old = self.procs.get(name)
        if old is not None:
            self.retired.append(old)
        self.procs[name] = proc
        return proc

    def sigkill(self, name: str) -> None:
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def wait_healthy(self, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{name} exited with {proc.returncode} during start-up:\n{tail}")
            try:
                response = httpx.get(f"{self.base_url}/healthz", timeout=5)
                last = response.json()
                if response.status_code == 200 and last.get("status") == "ok":
                    return last
            except (httpx.HTTPError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.3)
        raise RuntimeError(f"the console did not become healthy in {timeout:.0f}s: {last}")

    def stop_all(self) -> None:
        for proc in [*self.procs.values(), *self.retired]:
            with contextlib.suppress(Exception):
                stop_process(proc)


# --- Traffic and what it saw ------------------------------------------------------------------------------------------


@dataclass
class Window:
    """An outage: from the moment the dependency was stopped to the moment it answered again."""

    start: float = 0.0
    end: float = 0.0

    def classify(self, t0: float, t1: float) -> str:
        if not self.start:
            return "-"
        if t1 < self.start:
            return "before"
        if t0 > self.end:
            return "after"
        return "during"


@dataclass
class Recorder:
    t_zero: float = field(default_factory=time.monotonic)
    records: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    phase: str = "setup"
    windows: dict[str, Window] = field(default_factory=dict)

    def add(self, **record: Any) -> None:
        with self.lock:
            self.records.append(record)

    def request(self, http: httpx.Client, kind: str, method: str, url: str, **kwargs: Any) -> tuple[Any, httpx.Response | None]:
        """One request, recorded with its phase, status (or the transport error) and timing."""
        phase = self.phase
        t0 = time.monotonic()
        response: httpx.Response | None = None
        try:
            response = http.request(method, url, **kwargs)
            status: Any = response.status_code
        except httpx.TimeoutException:
            status = "timeout"
        except httpx.HTTPError as exc:
            status = f"conn_error:{type(exc).__name__}"
        t1 = time.monotonic()
        record = {"phase": phase, "kind": kind, "status": status, "t0": t0, "t1": t1, "ms": round((t1 - t0) * 1000, 1)}
        if response is not None and not response.is_success:
            record["retry_after"] = response.headers.get("Retry-After")
            try:
                payload = response.json()
                record["json"] = True
                error = payload.get("error") if isinstance(payload, dict) else None
                if isinstance(error, dict):
                    record["dependency"] = error.get("dependency")
                record["detail"] = str(payload.get("detail", ""))[:160] if isinstance(payload, dict) else ""
            except ValueError:
                record["json"] = False
                record["detail"] = response.text[:160]
        self.add(**record)
        return status, response


class Traffic:
    """Creates runs, reads them and approves refunds; everything it learns about the runs it created."""

    def __init__(self, base_url: str, key: str, approver_key: str, recorder: Recorder, rng: random.Random) -> None:
        self.base_url, self.key, self.approver_key = base_url, key, approver_key
        self.rec = recorder
        self.rng = rng
        self.rng_lock = threading.Lock()
        self.local = threading.local()
        self.lock = threading.Lock()
        self.accepted: dict[str, dict[str, Any]] = {}  # run id -> {phase, tag, key, kind}
        self.by_key: dict[str, set[str]] = defaultdict(set)  # Idempotency-Key -> run ids answered for it
        self.gave_up: list[dict[str, Any]] = []  # creates that never got a 2xx
        self.replayed = 0
        self.counter = 0
        self.pool = ThreadPoolExecutor(max_workers=24, thread_name_prefix="create")
        self.futures: list[Future[Any]] = []
        self.approved = 0

    def client(self, key: str) -> httpx.Client:
        clients = getattr(self.local, "clients", None)
        if clients is None:
            clients = self.local.clients = {}
        if key not in clients:
            clients[key] = httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=HTTP_TIMEOUT)
        return clients[key]

    def _next(self, phase: str) -> tuple[str, str, str]:
        with self.lock:
            self.counter += 1
            number = self.counter
        with self.rng_lock:
            kind, text = PROMPTS[self.rng.randrange(len(PROMPTS))]
        return f"{phase}-{number:04d}", kind, text

    def create(self, phase: str, *, idempotent: bool) -> str | None:
        """Create one run. With ``idempotent``: an Idempotency-Key, and retries with it on any non-2xx (bounded)."""
        tag, kind, text = self._next(phase)
        body = {"agent": "order-assistant", "input": text, "facts": {"bench_tag": tag, "bench_phase": phase}}
        headers = {"Idempotency-Key": str(uuid.uuid4())} if idempotent else {}
        key = headers.get("Idempotency-Key", "")
        http = self.client(self.key)
        attempts = MAX_CREATE_ATTEMPTS if idempotent else 1
        statuses: list[Any] = []
        for attempt in range(attempts):
            status, response = self.rec.request(http, "create", "POST", "/api/v1/runs", json=body, headers=headers)
            statuses.append(status)
            if response is not None and response.is_success:
                try:
                    run_id = str(response.json()["id"])
                except (ValueError, KeyError, TypeError):
                    run_id = ""
                if run_id:
                    with self.lock:
                        self.accepted.setdefault(run_id, {"phase": phase, "tag": tag, "key": key, "kind": kind})
                        if key:
                            self.by_key[key].add(run_id)
                        if response.headers.get("Idempotent-Replayed") == "true":
                            self.replayed += 1
                    return run_id
            if attempt + 1 < attempts:
                wait = 0.5
                if response is not None and (response.headers.get("Retry-After") or "").isdigit():
                    wait = min(float(response.headers["Retry-After"]), 2.0)
                time.sleep(wait)
        with self.lock:
            self.gave_up.append({"phase": phase, "tag": tag, "key": key, "statuses": statuses})
        return None

    def submit(self, phase: str, *, idempotent: bool) -> None:
        self.futures.append(self.pool.submit(self.create, phase, idempotent=idempotent))

    def drain(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for future in self.futures:
            with contextlib.suppress(Exception):
                future.result(timeout=max(0.1, deadline - time.monotonic()))
        self.futures = [f for f in self.futures if not f.done()]

    def read_some(self) -> None:
        """One read of a run, one of the run list and one of /healthz (what a dashboard or a client polls)."""
        http = self.client(self.key)
        with self.lock:
            ids = list(self.accepted)
        if ids:
            with self.rng_lock:
                run_id = self.rng.choice(ids)
            self.rec.request(http, "read", "GET", f"/api/v1/runs/{run_id}")
        self.rec.request(http, "list", "GET", "/api/v1/runs")
        self.rec.request(http, "healthz", "GET", "/healthz")

    def approve_pending(self) -> None:
        http = self.client(self.approver_key)
        status, response = self.rec.request(http, "approvals", "GET", "/api/v1/approvals", params={"status": "pending"})
        if response is None or status != 200:
            return
        try:
            pending = [item["id"] for item in response.json().get("results", [])]
        except (ValueError, AttributeError, KeyError, TypeError):
            return
        for request_id in pending:
            status, _ = self.rec.request(http, "approve", "POST", f"/api/v1/approvals/{request_id}/approve",
                                         json={"note": "approved by bench/faults.py"})
            if status == 200:
                with self.lock:
                    self.approved += 1


@contextlib.contextmanager
def background(every: float, action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` every ``every`` seconds in a thread while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            started = time.monotonic()
            with contextlib.suppress(Exception):
                action()
            stop.wait(max(0.0, every - (time.monotonic() - started)))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=HTTP_TIMEOUT * 3)


# --- The database's view ----------------------------------------------------------------------------------------------


class Db:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, sql: str, params: tuple[Any, ...] = (), *, retry_for: float = 30) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + retry_for
        while True:
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=3) as conn:
                    return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def columns(self, table: str) -> set[str]:
        rows = self.query("SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,))
        return {r[0] for r in rows}

    def unfinished(self, phase: str | None = None) -> int:
        if phase is None:
            return int(self.query("SELECT count(*) FROM agents_run WHERE status <> 'finished'")[0][0])
        sql = "SELECT count(*) FROM agents_run WHERE status <> 'finished' AND facts->>'bench_phase' = %s"
        return int(self.query(sql, (phase,))[0][0])

    def running(self) -> int:
        return int(self.query("SELECT count(*) FROM agents_run WHERE status = 'running'")[0][0])


def wait_finished(db: Db, phase: str | None, timeout: float) -> tuple[float, int]:
    """Wait until the phase's runs (all runs with None) are finished, at most ``timeout`` s: (seconds waited, unfinished)."""
    started = time.monotonic()
    while True:
        left = db.unfinished(phase)
        if left == 0 or time.monotonic() - started > timeout:
            return round(time.monotonic() - started, 1), left
        time.sleep(0.5)


# --- Phases -----------------------------------------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    console: Console
    redis: OwnRedis
    pg: OwnPostgres | SharedPostgres
    db: Db
    traffic: Traffic
    rec: Recorder
    rng: random.Random
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    unexpected_exits: list[dict[str, Any]] = field(default_factory=list)

    def supervise(self) -> None:
        """What systemd or Kubernetes would do: restart a console process that exited on its own (not one the bench
        killed), at most a second later. Each such exit is noted: it is a finding."""
        with self.console.lock:
            for name, proc in list(self.console.procs.items()):
                if name in self.console.killed or proc.poll() is None:
                    continue
                self.unexpected_exits.append({"phase": self.rec.phase, "process": name, "returncode": proc.returncode,
                                              "at_s": round(time.monotonic() - self.rec.t_zero, 1)})
                log(f"  !! {name} exited on its own (code {proc.returncode}); restarted (logs/{name}.log)")
                self.console.spawn(name)

    def steady(self, phase: str, seconds: float) -> None:
        """Create runs at a steady rate (Idempotency-Key, retries) for ``seconds``."""
        interval = 1.0 / CREATE_RATE_PER_S
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.traffic.submit(phase, idempotent=True)
            time.sleep(interval)

    def phase_kills(self) -> None:
        phase = "p1_worker_kills"
        self.rec.phase = phase
        runs, kills = self.args.runs, self.args.kills
        log(f"phase 1: {runs} runs, {kills} worker SIGKILLs at random moments")
        started = time.monotonic()
        per_burst = [runs // kills + (1 if i < runs % kills else 0) for i in range(kills)] if kills else []
        kill_log: list[dict[str, Any]] = []
        with background(0.5, self.traffic.approve_pending):
            for burst in per_burst:
                for _ in range(burst):
                    self.traffic.submit(phase, idempotent=False)
                time.sleep(self.rng.uniform(0.05, 0.8))  # the kill lands at a random moment of the burst's runs
                running = self.db.running()
                with self.console.lock:
                    workers = [n for n in ("worker-1", "worker-2") if self.console.procs[n].poll() is None]
                    victim = self.rng.choice(workers or ["worker-1", "worker-2"])
                    self.console.killed.add(victim)
                    self.console.sigkill(victim)
                kill_log.append({"at": round(time.monotonic() - started, 2), "worker": victim, "runs_running": running})
                time.sleep(self.rng.uniform(0.0, 0.6))
                with self.console.lock:
                    self.console.spawn(victim)
                    self.console.killed.discard(victim)
                time.sleep(self.rng.uniform(0.3, 1.5))
            if not kills:
                for _ in range(runs):
                    self.traffic.submit(phase, idempotent=False)
            self.traffic.drain()
            created_in = round(time.monotonic() - started, 1)
            waited, left = wait_finished(self.db, phase, timeout=120)
        self.phases[phase] = {"kills": kill_log, "seconds_creating_and_killing": created_in,
                              "seconds_to_finish_after": waited, "unfinished_after_wait": left,
                              "kills_with_runs_running": sum(1 for k in kill_log if k["runs_running"]),
                              "seconds": round(time.monotonic() - started, 1)}
        log(f"  {len(kill_log)} kills ({self.phases[phase]['kills_with_runs_running']} while runs were running), "
            f"then all finished in {waited}s (unfinished: {left})")

    def _outage(self, phase: str, stop: Callable[[], None], start: Callable[[], None]) -> None:
        started = time.monotonic()
        window = self.rec.windows[phase] = Window()
        with background(0.25, self.traffic.read_some), background(0.5, self.traffic.approve_pending):
            self.steady(phase, 3.0)
            for _ in range(6):  # runs in flight when the dependency goes
                self.traffic.submit(phase, idempotent=True)
            time.sleep(0.2)
            window.start = time.monotonic()
            stop()
            stopped = time.monotonic()
            self.steady(phase, max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped)))
            start()
            window.end = time.monotonic()
            self.steady(phase, 5.0)
            self.traffic.drain()
            waited, left = wait_finished(self.db, phase, timeout=120)
        self.phases[phase] = {"outage_seconds": round(window.end - window.start, 1), "seconds_to_finish_after": waited,
                              "unfinished_after_wait": left, "seconds": round(time.monotonic() - started, 1)}
        log(f"  outage {window.end - window.start:.1f}s; phase's runs finished {waited}s after the traffic stopped "
            f"(unfinished: {left})")

    def phase_redis(self) -> None:
        phase = "p2_redis_outage"
        self.rec.phase = phase
        log(f"phase 2: redis-server stopped (and wiped) for ~{OUTAGE_SECONDS:.0f}s under steady creates and reads")
        self._outage(phase, self.redis.stop, self.redis.start)

    def phase_postgres(self) -> None:
        phase = "p3_postgres_restart"
        self.rec.phase = phase
        if not self.pg.restartable:
            self.phases[phase] = {"skipped": "no PostgreSQL cluster of its own could be started; the shared one is never restarted"}
            log("phase 3: SKIPPED (running on a dedicated database of the shared server, which is never restarted)")
            return
        assert isinstance(self.pg, OwnPostgres)
        pg = self.pg
        log(f"phase 3: PostgreSQL stopped (-m fast) for ~{OUTAGE_SECONDS:.0f}s, then started, under steady creates and reads")
        self._outage(phase, lambda: pg.stop("fast"), pg.start)


# --- Findings ---------------------------------------------------------------------------------------------------------


def findings(bench: Bench) -> dict[str, Any]:
    db, traffic = bench.db, bench.traffic
    run_cols = db.columns("agents_run")
    out: dict[str, Any] = {}

    rows = db.query("SELECT id::text, facts->>'bench_phase', facts->>'bench_tag', status, terminal_reason, crash_count, "
                    "extract(epoch FROM finished_at - created_at) FROM agents_run")
    by_phase: dict[str, dict[str, Any]] = defaultdict(lambda: {"accepted": 0, "finished": Counter(), "not_finished": Counter(),
                                                                "durations": [], "crashes": Counter()})
    db_ids = set()
    tags: Counter[str] = Counter()
    lost = []
    for run_id, phase, tag, status, reason, crashes, seconds in rows:
        db_ids.add(run_id)
        tags[tag] += 1
        entry = by_phase[phase or "?"]
        entry["accepted"] += 1
        entry["crashes"][crashes] += 1
        if status == "finished":
            entry["finished"][reason or "?"] += 1
            if seconds is not None:
                entry["durations"].append(float(seconds))
        else:
            entry["not_finished"][status] += 1
            lost.append({"id": run_id, "phase": phase, "status": status})
    runs: dict[str, Any] = {}
    for phase, entry in sorted(by_phase.items()):
        durations = sorted(entry["durations"])
        runs[phase] = {
            "accepted": entry["accepted"],
            "finished_by_terminal_reason": dict(entry["finished"]),
            "not_finished": dict(entry["not_finished"]),
            "crash_count": {str(k): v for k, v in sorted(entry["crashes"].items())},
            "seconds_created_to_finished": {
                "median": round(statistics.median(durations), 2) if durations else None,
                "p95": round(durations[int(0.95 * (len(durations) - 1))], 2) if durations else None,
                "max": round(durations[-1], 2) if durations else None,
            },
        }
    out["runs"] = runs
    out["lost"] = lost
    client_ids = set(traffic.accepted)
    out["acknowledged_vs_database"] = {
        "acknowledged_to_client": len(client_ids),
        "in_database": len(db_ids),
        "acknowledged_but_missing_in_database": sorted(client_ids - db_ids),
        "in_database_but_never_acknowledged": len(db_ids - client_ids),
        "creates_given_up": traffic.gave_up,
    }

    # RunEvent seq: 1..last_seq, each once.
    seq_rows = db.query(
        "SELECT r.id::text, r.last_seq, count(e.id), count(DISTINCT e.seq), min(e.seq), max(e.seq) "
        "FROM agents_run r LEFT JOIN agents_runevent e ON e.run_id = r.id GROUP BY r.id, r.last_seq")
    gaps, dups, mismatched = [], [], []
    for run_id, last_seq, count, distinct, low, high in seq_rows:
        if count != distinct:
            dups.append(run_id)
        if count and (low != 1 or high - low + 1 != distinct):
            gaps.append(run_id)
        if (high or 0) != last_seq:
            mismatched.append(run_id)
    out["run_events"] = {"runs_checked": len(seq_rows), "runs_with_seq_gaps": gaps, "runs_with_duplicate_seq": dups,
                         "runs_whose_last_seq_differs_from_max_seq": mismatched}

    # Write tools: one dispatch per (run, step, tool, arguments).
    write_tools = sorted({r[0] for r in db.query("SELECT DISTINCT name FROM tools_tool WHERE category = 'write'")})
    audit = db.query(
        "SELECT run_id::text, step, tool_name, arguments_hash, array_agg(status ORDER BY id) FROM audit_toolcallaudit "
        "WHERE tool_name = ANY(%s) GROUP BY run_id, step, tool_name, arguments_hash", (write_tools,))
    statuses: Counter[str] = Counter()
    dup_effects, multi_dispatch, still_started = [], [], []
    per_run_ok: Counter[tuple[str, str, str]] = Counter()
    for run_id, step, tool, args_hash, row_statuses in audit:
        statuses.update(row_statuses)
        ok = row_statuses.count("ok")
        dispatched = sum(row_statuses.count(s) for s in ("ok", "error", "timeout", "outcome_unknown"))
        per_run_ok[(run_id, tool, args_hash)] += ok
        key = {"run": run_id, "step": step, "tool": tool, "statuses": row_statuses}
        if ok > 1:
            dup_effects.append(key)
        if dispatched > 1:
            multi_dispatch.append(key)
        if "started" in row_statuses:
            still_started.append(key)
    out["write_tool_audit"] = {
        "write_tools": write_tools,
        "groups_run_step_tool_arguments": len(audit),
        "rows_by_status": dict(statuses),
        "duplicate_side_effects_ok_more_than_once": dup_effects,
        "dispatched_more_than_once": multi_dispatch,
        "still_started_outcome_never_recorded": still_started,
        "ok_more_than_once_in_one_run_across_steps": [
            {"run": r, "tool": t, "ok": n} for (r, t, _h), n in per_run_ok.items() if n > 1],
    }

    # Idempotency: no key made two runs (database), no key answered with two run ids (client), no tag in two runs.
    idem: dict[str, Any] = {"replayed_answers": traffic.replayed}
    if "idempotency_key" in run_cols:
        rows = db.query("SELECT idempotency_key, count(*) FROM agents_run WHERE idempotency_key <> '' "
                        "GROUP BY idempotency_key HAVING count(*) > 1")
        idem["keys_with_two_or_more_runs_in_database"] = [{"key": k, "runs": n} for k, n in rows]
        stored = {r[0] for r in db.query("SELECT idempotency_key FROM agents_run WHERE idempotency_key <> ''")}
        sent = set(traffic.by_key) | {g["key"] for g in traffic.gave_up if g["key"]}
        idem["keys_sent"] = len(sent)
        idem["keys_stored_on_runs"] = len(stored & sent)
    else:
        idem["keys_with_two_or_more_runs_in_database"] = "n/a: agents_run has no idempotency_key column"
    idem["keys_answered_with_two_or_more_run_ids"] = [{"key": k, "runs": sorted(v)} for k, v in traffic.by_key.items() if len(v) > 1]
    idem["requests_with_two_or_more_runs_by_tag"] = [t for t, n in tags.items() if n > 1]
    out["idempotency"] = idem

    if "needs_attention" in run_cols:
        rows = db.query("SELECT id::text, facts->>'bench_phase', attention_reasons FROM agents_run WHERE needs_attention")
        kinds: Counter[str] = Counter()
        for _id, _phase, reasons in rows:
            for reason in reasons or []:
                kinds[str(reason.get("kind") if isinstance(reason, dict) else reason)] += 1
        out["needs_attention"] = {"runs": len(rows), "by_phase": dict(Counter(r[1] for r in rows)), "reasons": dict(kinds),
                                  "ids": [r[0] for r in rows]}
    else:
        out["needs_attention"] = "n/a: agents_run has no needs_attention column"

    # HTTP statuses per phase and kind (and, for the outages, per window).
    http: dict[str, Any] = {}
    outage_errors: list[dict[str, Any]] = []
    for record in bench.rec.records:
        window = bench.rec.windows.get(record["phase"])
        record["window"] = window.classify(record["t0"], record["t1"]) if window else "-"
        if record["window"] == "during" and record["status"] not in (200, 202):
            outage_errors.append({k: v for k, v in record.items() if k not in ("t0", "t1")}
                                 | {"at_s": round(record["t0"] - bench.rec.t_zero, 2)})
        phase = http.setdefault(record["phase"], {"by_kind": defaultdict(Counter), "by_window": defaultdict(Counter),
                                                  "latency_ms": defaultdict(list), "503_by_dependency": Counter(),
                                                  "server_errors_5xx_other_than_503": 0, "status_500": 0,
                                                  "503_without_retry_after": 0, "non_json_errors": 0})
        phase["latency_ms"][record["kind"]].append(record["ms"])
        status = str(record["status"])
        phase["by_kind"][record["kind"]][status] += 1
        if record["window"] != "-":
            phase["by_window"][f"{record['window']}:{record['kind']}"][status] += 1
        if record["status"] == 500:
            phase["status_500"] += 1
        if isinstance(record["status"], int) and record["status"] >= 500 and record["status"] != 503:
            phase["server_errors_5xx_other_than_503"] += 1
        if record["status"] == 503:
            phase["503_by_dependency"][str(record.get("dependency"))] += 1
            if not record.get("retry_after"):
                phase["503_without_retry_after"] += 1
        if record.get("json") is False:
            phase["non_json_errors"] += 1
    for phase in http.values():
        phase["by_kind"] = {k: dict(v) for k, v in phase["by_kind"].items()}
        phase["by_window"] = {k: dict(v) for k, v in sorted(phase["by_window"].items())}
        phase["503_by_dependency"] = dict(phase["503_by_dependency"])
        phase["latency_ms"] = {k: {"median": round(statistics.median(v), 1), "max": round(max(v), 1)}
                               for k, v in sorted(phase["latency_ms"].items())}
    out["http"] = http
    out["non_2xx_during_outages"] = outage_errors[:300]
    out["approvals_granted"] = traffic.approved
    return out


def print_report(result: dict[str, Any]) -> None:
    f = result["findings"]
    print()
    print("=" * 100)
    print(f"fault injection: {result['config']['runs']} runs / {result['config']['kills']} kills / seed {result['config']['seed']}; "
          f"PostgreSQL: {result['postgres']}; wall {result['wall_seconds']}s")
    print("-" * 100)
    print(f"{'phase':<22}{'accepted':>9}{'finished':>9}{'lost':>6}{'crashed':>8}  {'terminal reasons':<34}"
          f"{'median s':>9}{'p95 s':>7}{'max s':>7}")
    for phase, r in f["runs"].items():
        finished = sum(r["finished_by_terminal_reason"].values())
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(r["finished_by_terminal_reason"].items()))
        lost = sum(r["not_finished"].values())
        crashed = sum(n for k, n in r["crash_count"].items() if k != "0")
        timing = r["seconds_created_to_finished"]
        print(f"{phase:<22}{r['accepted']:>9}{finished:>9}{lost:>6}{crashed:>8}  {reasons:<34}"
              f"{timing['median']!s:>9}{timing['p95']!s:>7}{timing['max']!s:>7}")
    print("-" * 100)
    print(f"{'phase':<22}{'kind':<11}statuses (500s marked !!)")
    for phase, h in f["http"].items():
        for kind, counts in sorted(h["by_kind"].items()):
            text = ", ".join(f"{'!!' if s == '500' else ''}{s}×{n}" for s, n in sorted(counts.items()))
            print(f"{phase:<22}{kind:<11}{text}")
        for window, counts in h["by_window"].items():
            if window.startswith("during:"):
                text = ", ".join(f"{'!!' if s == '500' else ''}{s}×{n}" for s, n in sorted(counts.items()))
                print(f"{'':<22}{window:<22}{text}")
        flag = "  <<< 500s" if h["status_500"] else ""
        print(f"{'':<22}500s: {h['status_500']}{flag}; other 5xx: {h['server_errors_5xx_other_than_503'] - h['status_500']}; "
              f"503 by dependency: {h['503_by_dependency'] or '-'}, without Retry-After: {h['503_without_retry_after']}; "
              f"non-JSON errors: {h['non_json_errors']}; create ms median/max: "
              f"{h['latency_ms'].get('create', {}).get('median', '-')}/{h['latency_ms'].get('create', {}).get('max', '-')}")
    print("-" * 100)
    ack = f["acknowledged_vs_database"]
    ev, wa, idem = f["run_events"], f["write_tool_audit"], f["idempotency"]
    print(f"acknowledged (2xx) {ack['acknowledged_to_client']}, in database {ack['in_database']}, "
          f"acknowledged but missing {len(ack['acknowledged_but_missing_in_database'])}, "
          f"in database never acknowledged {ack['in_database_but_never_acknowledged']}, creates given up {len(ack['creates_given_up'])}")
    print(f"lost (not finished after the bounded wait): {len(f['lost'])}")
    print(f"RunEvent seq: {ev['runs_checked']} runs, gaps {len(ev['runs_with_seq_gaps'])}, duplicates "
          f"{len(ev['runs_with_duplicate_seq'])}, last_seq != max(seq) {len(ev['runs_whose_last_seq_differs_from_max_seq'])}")
    print(f"write tools {wa['write_tools']}: {wa['groups_run_step_tool_arguments']} (run, step, tool, args) groups, rows "
          f"{wa['rows_by_status']}; duplicate side effects {len(wa['duplicate_side_effects_ok_more_than_once'])}, "
          f"dispatched twice {len(wa['dispatched_more_than_once'])}, still 'started' {len(wa['still_started_outcome_never_recorded'])}")
    two = idem["keys_with_two_or_more_runs_in_database"]
    print(f"idempotency: keys sent {idem.get('keys_sent', '?')}, stored on runs {idem.get('keys_stored_on_runs', '?')}, "
          f"keys with 2+ runs {two if isinstance(two, str) else len(two)}, keys answered with 2+ ids "
          f"{len(idem['keys_answered_with_two_or_more_run_ids'])}, requests (tags) with 2+ runs "
          f"{len(idem['requests_with_two_or_more_runs_by_tag'])}, replayed answers {idem['replayed_answers']}")
    na = f["needs_attention"]
    attention = na if isinstance(na, str) else f"{na['runs']} runs {na['by_phase']}, reasons {na['reasons']}"
    print(f"needs_attention: {attention}")
    print(f"approvals granted: {f['approvals_granted']}; processes that exited on their own: {result['unexpected_exits'] or 'none'}")
    for phase, info in result["phases"].items():
        print(f"{phase}: " + ", ".join(f"{k}={v}" for k, v in info.items() if k != "kills"))
    print("=" * 100)


# --- Main -------------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=96, help="Runs created during the worker kills (default 96).")
    parser.add_argument("--kills", type=int, default=32, help="Worker SIGKILLs during phase 1 (default 32).")
    parser.add_argument("--seed", type=int, default=1, help="Random seed: prompts, kill moments, victims (default 1).")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--keep", action="store_true", help="Keep the temp dir (logs, data) afterwards.")
    args = parser.parse_args()
    if args.runs < 1 or args.kills < 0:
        parser.error("--runs must be at least 1 and --kills at least 0")

    def on_sigterm(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    wall = time.monotonic()
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="agentops-faults-"))
    redis = OwnRedis(workdir)
    pg: OwnPostgres | SharedPostgres | None = None
    console: Console | None = None
    failed = True
    notes: list[str] = []
    try:
        log(f"work dir {workdir}")
        redis.start()
        log(f"own redis-server on 127.0.0.1:{redis.port} (no persistence)")
        own = OwnPostgres(workdir)
        try:
            own.setup()
            pg = own
            log(f"own PostgreSQL cluster on 127.0.0.1:{own.port} ({own.how})")
        except Exception as exc:  # no own cluster possible here: the documented fallback
            own.kill()
            notes.append(f"no own PostgreSQL cluster ({exc}); used a dedicated database on the shared server; phase 3 skipped")
            log(f"!! {notes[-1]}")
            pg = SharedPostgres()
            pg.setup()
        api_key = f"aok_{secrets.token_hex(4)}_{secrets.token_hex(16)}"
        approver_key = f"aok_{secrets.token_hex(4)}_{secrets.token_hex(16)}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL"))}
        env.update(
            DATABASE_URL=pg.url, REDIS_URL=redis.url, DEBUG="false", HTTPS_ONLY="false", SECRET_KEY=secrets.token_urlsafe(48),
            AGENTOPS_VAR_DIR=str(workdir), AGENTOPS_QUEUE=f"agentops-faults-{os.getpid()}",
            PROMETHEUS_MULTIPROC_DIR=str(workdir / "prometheus"), PYTHONUNBUFFERED="1",
            DEMO_API_KEY=api_key, DEMO_PASSWORD=secrets.token_urlsafe(16), **STACK_SETTINGS,
        )
        env.pop("OPENAI_BASE_URL", None)
        (workdir / "prometheus").mkdir()
        console = Console(workdir, env)
        log("migrate, seed_demo, approver key")
        console.manage("migrate", "--noinput")
        console.manage("seed_demo")
        console.manage("shell", "-c", (
            "from django.contrib.auth import get_user_model\n"
            "from tenants.models import Role, Tenant\n"
            "from accounts.services import create_api_key\n"
            "from tenants.scoping import actor_for_user\n"
            "user = get_user_model().objects.get(username='approver')\n"
            f"create_api_key(tenant=Tenant.objects.get(slug='demo'), name='faults-approver', owner=user, role=Role.APPROVER, "
            f"actor=actor_for_user(get_user_model().objects.get(username='admin')), raw={approver_key!r})\n"))
        for name in ("worker-1", "worker-2", "beat", "server"):
            console.spawn(name)
        health = console.wait_healthy()
        log(f"console at {console.base_url}: /healthz {health.get('status')}")

        rec = Recorder()
        db = Db(pg.url)
        traffic = Traffic(console.base_url, api_key, approver_key, rec, rng)
        bench = Bench(args, console, redis, pg, db, traffic, rec, rng)
        with background(1.0, bench.supervise):
            bench.phase_kills()
            bench.phase_redis()
            bench.phase_postgres()
            rec.phase = "final"
            log("final: waiting (bounded) for every accepted run to finish")
            with background(0.5, traffic.approve_pending):
                waited, left = wait_finished(db, None, timeout=90)
        bench.phases["final_wait"] = {"seconds": waited, "unfinished": left}
        traffic.pool.shutdown(wait=False, cancel_futures=True)

        result = {
            "benchmark": "faults",
            "config": {"runs": args.runs, "kills": args.kills, "seed": args.seed, "outage_seconds": OUTAGE_SECONDS,
                       "create_rate_per_s": CREATE_RATE_PER_S, "max_create_attempts": MAX_CREATE_ATTEMPTS,
                       "workers": 2, "worker_concurrency": WORKER_CONCURRENCY, "settings": STACK_SETTINGS},
            "postgres": pg.how,
            "notes": notes,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
            "phases": bench.phases,
            "unexpected_exits": bench.unexpected_exits,
            "findings": findings(bench),
        }
        result["wall_seconds"] = round(time.monotonic() - wall, 1)
        print_report(result)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        log(f"wrote {out}")
        failed = False
        return 0
    except KeyboardInterrupt:
        log("interrupted: stopping what this script started")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if console is not None:
            console.stop_all()
        redis.stop()
        if pg is not None:
            with contextlib.suppress(Exception):
                pg.teardown()
        if args.keep or failed:
            log(f"kept {workdir} (logs in {workdir / 'logs'})")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

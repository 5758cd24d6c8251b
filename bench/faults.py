"""Issue #50's fault suite against a real production-mode stack of its own: worker SIGKILLs, Redis outages (kept and
emptied), PostgreSQL restarts and a table lock, under agent runs, refund-desk flow runs, replays and approval notices.

    .venv/bin/python bench/faults.py [--quick | --full] [--runs N] [--kills N] [--outages N] [--seed 1] [--keep]

``--quick`` (the default: 96 runs, 32 kills, one round of the other faults) takes a few minutes; ``--full`` is the
issue's scale (600 runs in the kill phase, 40 kills, two rounds: >= 40 faults, >= 600 runs). Exit status 1 when one of
the goals fails (0 lost runs, 0 duplicate dispatches at the counting target, 0 deadlock failures, 0 stuck replay batches).

It never touches the machine's shared PostgreSQL (127.0.0.1:5432) or Redis (127.0.0.1:6379): it starts its own
``redis-server`` (free port, no automatic persistence, in a temp dir) and its own PostgreSQL cluster (``initdb`` +
``pg_ctl`` in a temp dir, free port, trust auth on 127.0.0.1; as the ``postgres`` user through ``runuser``/``su`` when
run as root, since initdb and postgres refuse root). Only if no own cluster can be started does it fall back to a
dedicated database on the shared server (``BENCH_SHARED_PG``, default ``postgres://postgres@127.0.0.1:5432``), dropped
at the end, and then it skips the PostgreSQL restarts and says so. It also runs a *counting target* of its own: an HTTP
server on 127.0.0.1 that records every POST on arrival (its ``Idempotency-Key``, ``X-AgentOps-Delivery`` and body)
and answers a refund after 0.2-1.5 s, so a worker SIGKILL can land mid-dispatch; the stack's ``TOOL_EGRESS_ALLOW``
names that address and port only.

On them it starts the console in production mode (``migrate``, ``seed_demo``, ``manage.py serve --no-worker``, two
``celery worker`` processes and one ``celery beat``, short lease, sweep and notice settings) and drives it over HTTP on
127.0.0.1 only, with the demo tenant's API key (fixed through ``DEMO_API_KEY``) and an approver key it creates. Through
the API it adds an HTTP write tool posting to the target (``refund_http``, needs approval), a copy of the seeded
``refund-desk`` flow whose ``refund`` node calls it (``refund-desk-counted``; the run's tag goes in the body), and a
Slack-style webhook channel to the target for approval notices.

Every phase mixes: agent runs of the demo agent (a quarter of them refunds through ``refund_order``, approved),
flow runs of the counted desk (half of them above the manager threshold: a manager approval node, then the tool's own
approval), reads, approvals (an approver acts once the request's notice reached the target, or after
NOTICE_WAIT_SECONDS without one) and replay batches (an evaluation set of finished runs of the agent or the flow,
replayed in recorded mode, every REPLAY_EVERY_SECONDS). The faults:

1. worker kills: ``--runs`` runs while a random worker is SIGKILLed ``--kills`` times at random moments and restarted;
2. per round (``--outages``): Redis stopped ~5 s *keeping* its data (``SHUTDOWN SAVE``, restarted loading the dump),
   Redis stopped ~5 s and *emptied*, PostgreSQL ``pg_ctl stop -m fast`` ~5 s, and ``agents_run`` locked ACCESS
   EXCLUSIVE ~5 s; each under steady creates carrying an ``Idempotency-Key``, retried with it on any non-2xx (bounded).

Then, from the database (psycopg, plain SQL), the target and the logs: lost runs (accepted, not finished after a
bounded wait), duplicate dispatches at the counting target (two POSTs for one flow run's refund, whatever their keys),
``deadlock detected`` in the cluster's log and runs/flow nodes that ended on a deadlock or OperationalError, replay
batches still queued/running after a bounded wait (stuck), approval notices never delivered and duplicated, HTTP 500s,
processes that exited on their own (exit codes), plus the earlier checks (RunEvent ``seq``, ToolCallAudit rows of write
tools, idempotency keys, runs needing attention, statuses per phase). A table on stdout with a PASS/FAIL line per goal,
and ``bench/results/faults.json``. It measures whatever the code does.

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
import re
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    # Approval notices: a delivery whose task was lost is sent again after 5 s (the minimum), retries 1 s apart.
    "NOTIFY_RESEND_AFTER_SECONDS": "5",
    "NOTIFY_RETRY_BASE_SECONDS": "1",
    # A flow node whose worker died is started again 5 s after its timeout (default 30 s after): bounded phases.
    "FLOW_NODE_LEASE_GRACE_SECONDS": "5",
}
WORKER_CONCURRENCY = 4
OUTAGE_SECONDS = 5.0
CREATE_RATE_PER_S = 3.0  # steady creates during phases 2 and 3
MAX_CREATE_ATTEMPTS = 8  # phases 2 and 3: one create, retried with its Idempotency-Key on any non-2xx
HTTP_TIMEOUT = 15.0
LOCK_SECONDS = 5.0  # the table-lock fault: agents_run held in ACCESS EXCLUSIVE mode this long

#: The flow under test: the seeded refund desk, copied through the API with its ``refund`` node calling an HTTP write
#: tool whose endpoint is the counting target (the seeded ``refund_order`` is a Python function: nothing to count).
SEEDED_FLOW = "refund-desk"
FLOW_SLUG = "refund-desk-counted"
REFUND_TOOL = "refund_http"
FLOW_SHARE = 0.35  # of the runs created, this share are flow runs; half of them above the manager threshold
FLOW_AMOUNTS = ("30.00", "250.00")  # below and above the seeded desk's 200 threshold (the second waits for a manager)
REFUND_ANSWER_SECONDS = (0.2, 1.5)  # the counting target answers a refund after this long (recorded on arrival)
#: An approver acts on the notice: a pending request is approved once its notice reached the target, or after this
#: long without one (then it counts as a notice not delivered in time).
NOTICE_WAIT_SECONDS = 25.0
REPLAY_EVERY_SECONDS = 10.0  # each phase starts a replay batch this often (an evaluation set of finished runs)
REPLAY_SET_SIZE = 12
REPLAY_WAIT_SECONDS = 120.0  # at the end: a batch still queued/running after this long is stuck
PHASE_WAIT_SECONDS = 120.0  # each phase waits at most this long for its runs (those left go on into the next phase)
FINAL_STALL_SECONDS = 90.0  # at the end: a run still unfinished once nothing moved for this long is lost ...
FINAL_WAIT_SECONDS = 900.0  # ... or once this long has passed
APPROVAL_LINK = re.compile(r"/approvals/([0-9A-Za-z-]+)/")
QUICK = {"runs": 96, "kills": 32, "outages": 1}
FULL = {"runs": 600, "kills": 40, "outages": 2}

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
        """Stopped and emptied: no persistence, and any dump of an earlier kept outage removed before it comes back."""
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
        (self.dir / "dump.rdb").unlink(missing_ok=True)

    def stop_keeping_data(self) -> None:
        """Stopped with its data kept: ``SHUTDOWN SAVE`` writes the dump and exits; the next start loads it (the queue's
        messages, unacknowledged ones included, and the throttle counters survive the outage)."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.sendall(b"SHUTDOWN SAVE\r\n")
            with contextlib.suppress(OSError):
                sock.recv(64)  # nothing on success: the server closes the connection as it exits
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stop_process(self.proc)
        self.proc = None


# --- The counting target: the harness's own HTTP endpoint for the refund tool and the notification channel -----------


class CountingTarget:
    """A small HTTP server on 127.0.0.1 that records every POST: ``/refund`` answers as a payment system would (the
    flow's write tool), ``/notify`` takes approval notices (the tenant's webhook channel). It never dedupes: what it
    counts is what reached it."""

    def __init__(self, seed: int) -> None:
        self.posts: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body: Any = json.loads(raw or b"null")
                except ValueError:
                    body = raw.decode(errors="replace")[:500]
                with target.lock:
                    number = len(target.posts) + 1
                    target.posts.append({"path": self.path, "at": time.monotonic(), "body": body,
                                         "idempotency_key": self.headers.get("Idempotency-Key", ""),
                                         "delivery": self.headers.get("X-AgentOps-Delivery", ""),
                                         "event": self.headers.get("X-AgentOps-Event", "")})
                answer: dict[str, Any] = {"ok": True}
                if self.path.startswith("/refund"):
                    with target.lock:
                        delay = target.rng.uniform(*REFUND_ANSWER_SECONDS)
                    time.sleep(delay)  # a payment system takes a moment: a worker killed meanwhile leaves it unanswered
                if self.path.startswith("/refund") and isinstance(body, dict):
                    answer = {"refund_id": f"RF{number:06d}", "order_id": body.get("order_id"), "amount": body.get("amount"),
                              "currency": "CNY", "status": "refunded", "remaining_refundable": "0.00"}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def received(self, prefix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [p for p in self.posts if p["path"].startswith(prefix)]

    def noticed_requests(self) -> set[str]:
        """Approval request ids whose notice reached the target (the console's link in the Slack body names it)."""
        found = set()
        for post in self.received("/notify"):
            match = APPROVAL_LINK.search(json.dumps(post["body"]))
            if match:
                found.add(match.group(1))
        return found


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
    """Creates runs (agent and flow runs), reads them, approves what waits and starts replays; everything it learns."""

    def __init__(self, base_url: str, key: str, approver_key: str, recorder: Recorder, rng: random.Random,
                 target: CountingTarget, db: Db) -> None:
        self.base_url, self.key, self.approver_key = base_url, key, approver_key
        self.rec = recorder
        self.rng = rng
        self.target = target
        self.db = db
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
        self.approved_without_notice: list[str] = []
        self.first_pending: dict[str, float] = {}  # approval request id -> when it was first seen pending
        self.replays: list[dict[str, Any]] = []  # {phase, agent, evaluation_set, batch, status}
        self.versions: dict[str, int] = {}  # agent/flow slug -> its current version number (the replay candidate)

    def client(self, key: str) -> httpx.Client:
        clients = getattr(self.local, "clients", None)
        if clients is None:
            clients = self.local.clients = {}
        if key not in clients:
            clients[key] = httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=HTTP_TIMEOUT)
        return clients[key]

    def _next(self, phase: str) -> tuple[str, str, dict[str, Any]]:
        """The next run to create: an agent run (one of PROMPTS) or a flow run of the counted refund desk."""
        with self.lock:
            self.counter += 1
            number = self.counter
        tag = f"{phase}-{number:04d}"
        facts = {"bench_tag": tag, "bench_phase": phase}
        with self.rng_lock:
            flow = self.rng.random() < FLOW_SHARE
            amount = self.rng.choice(FLOW_AMOUNTS)
            kind, text = PROMPTS[self.rng.randrange(len(PROMPTS))]
        if flow:
            kind = "flow_manager" if float(amount) > 200 else "flow"
            return tag, kind, {"flow": FLOW_SLUG, "facts": facts, "input": {
                "order_id": "O202411280001", "amount": amount, "reason": f"damaged cup ({tag})", "ref": tag}}
        return tag, kind, {"agent": "order-assistant", "input": text, "facts": facts}

    def create(self, phase: str, *, idempotent: bool) -> str | None:
        """Create one run. With ``idempotent``: an Idempotency-Key, and retries with it on any non-2xx (bounded)."""
        tag, kind, body = self._next(phase)
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
            self.gave_up.append({"phase": phase, "tag": tag, "key": key, "kind": kind, "statuses": statuses})
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
        """Approve what waits, as an approver told by the webhook would: once the request's notice reached the counting
        target, or after NOTICE_WAIT_SECONDS without one (noted: a notice not delivered in time)."""
        http = self.client(self.approver_key)
        status, response = self.rec.request(http, "approvals", "GET", "/api/v1/approvals", params={"status": "pending"})
        if response is None or status != 200:
            return
        try:
            pending = [str(item["id"]) for item in response.json().get("results", [])]
        except (ValueError, AttributeError, KeyError, TypeError):
            return
        noticed = self.target.noticed_requests()
        now = time.monotonic()
        for request_id in pending:
            first = self.first_pending.setdefault(request_id, now)
            late = now - first > NOTICE_WAIT_SECONDS
            if request_id not in noticed and not late:
                continue
            status, _ = self.rec.request(http, "approve", "POST", f"/api/v1/approvals/{request_id}/approve",
                                         json={"note": "approved by bench/faults.py"})
            if status == 200:
                with self.lock:
                    self.approved += 1
                    if request_id not in noticed:
                        self.approved_without_notice.append(request_id)

    def start_replay(self) -> None:
        """An evaluation set of finished runs (of the agent, or of the counted flow, in turn) and a replay of it on the
        current version, recorded mode, two shards."""
        with self.lock:
            slug = ("order-assistant", FLOW_SLUG)[len(self.replays) % 2]
            phase = self.rec.phase
        entry: dict[str, Any] = {"phase": phase, "agent": slug}
        rows = self.db.query(
            "SELECT r.id::text FROM agents_run r JOIN agents_agent a ON a.id = r.agent_id WHERE a.slug = %s "
            "AND r.status = 'finished' AND r.terminal_reason = 'final_answer' ORDER BY r.finished_at DESC LIMIT %s",
            (slug, REPLAY_SET_SIZE), retry_for=2)
        if not rows:
            return
        with self.lock:
            self.replays.append(entry)
            number = len(self.replays)
        http = self.client(self.key)
        status, response = self.rec.request(http, "evalset", "POST", "/api/v1/evaluation-sets", json={
            "name": f"faults {number:04d} {phase}", "agent": slug, "run_ids": [r[0] for r in rows]})
        entry["evaluation_set_status"] = status
        if response is None or status != 201:
            return
        entry["evaluation_set"] = response.json().get("id")
        status, response = self.rec.request(http, "replay", "POST", "/api/v1/replays", json={
            "evaluation_set": entry["evaluation_set"], "candidate": {"agent": slug, "version": self.versions.get(slug, 1)},
            "model_mode": "recorded", "miss_policy": "stop", "concurrency": 2})
        entry["replay_status"] = status
        if response is not None and status in (200, 201, 202):
            with contextlib.suppress(ValueError, AttributeError):
                entry["batch"] = response.json().get("id")


def setup_counted_flow(base_url: str, key: str, target: CountingTarget) -> dict[str, int]:
    """Through the API, as the demo tenant's operator: an HTTP write tool posting to the counting target, a copy of the
    seeded refund desk whose ``refund`` node calls it (with the run's ``ref`` in the body, so a POST names its run), and a
    Slack-style webhook channel to the target for approval notices. Returns the current version of each replayed agent."""
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        def call(method: str, url: str, **kwargs: Any) -> Any:
            response = http.request(method, url, **kwargs)
            if not response.is_success:
                raise RuntimeError(f"{method} {url} answered {response.status_code}: {response.text[:1500]}")
            return response.json()

        seeded = call("GET", f"/api/v1/flows/{SEEDED_FLOW}/versions")
        definition = json.loads(json.dumps(seeded[0]["definition"]))
        definition["input_schema"]["properties"]["ref"] = {"type": "string", "maxLength": 64,
                                                           "description": "the harness's tag of the run"}
        refund = next(n for n in definition["nodes"] if n["id"] == "refund")
        refund["tool"] = REFUND_TOOL
        refund["inputs"] = {**refund["inputs"], "ref": "input.ref"}
        definition["description"] = "The refund desk, refunding through bench/faults.py's counting target."
        props = {"order_id": {"type": "string"}, "amount": {"type": "string"}, "reason": {"type": "string"},
                 "ref": {"type": "string"}}
        call("POST", "/api/v1/tools", json={
            "name": REFUND_TOOL, "kind": "http", "category": "write", "idempotent": False, "requires_approval": True,
            "description": "Refund money for an order through the payment system (bench/faults.py's counting target).",
            "parameters": {"type": "object", "required": list(props), "properties": props},
            "config": {"method": "POST", "url": f"{target.url}/refund", "body": "json"},
            "required_scopes": ["orders:refund"], "timeout_seconds": 10})
        call("POST", "/api/v1/flows", json={"slug": FLOW_SLUG, "name": "Refund desk (counted)"})
        version = call("POST", f"/api/v1/flows/{FLOW_SLUG}/versions",
                       json={"model": "demo/planner", "definition": definition, "make_current": True})
        call("POST", "/api/v1/notification-channels", json={
            "name": "faults counting target", "kind": "webhook_slack", "target": f"{target.url}/notify",
            "events": ["arrived"], "tools": [], "enabled": True})
        agent = call("GET", "/api/v1/agents/order-assistant/versions")
        return {FLOW_SLUG: int(version["number"]), "order-assistant": int(next(v for v in agent if v["current"])["number"])}


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


def wait_settled(db: Db, stall: float, cap: float) -> tuple[float, int]:
    """The final wait: until every run finished, or nothing moved for ``stall`` s (no run finished, no event written,
    no node or approval changed), at most ``cap`` s. A run still unfinished then is lost. (seconds waited, unfinished)"""
    started = last_move = time.monotonic()
    last: Any = None
    while True:
        row = db.query("SELECT (SELECT count(*) FROM agents_run WHERE status <> 'finished'), "
                       "(SELECT coalesce(sum(last_seq), 0) FROM agents_run), "
                       "(SELECT count(*) FROM flows_flownoderun WHERE status IN ('done', 'failed', 'skipped')), "
                       "(SELECT count(*) FROM tools_approvalrequest WHERE status <> 'pending')")[0]
        now = time.monotonic()
        if row != last:
            last, last_move = row, now
        if row[0] == 0 or now - last_move > stall or now - started > cap:
            return round(now - started, 1), int(row[0])
        time.sleep(1.0)


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
    target: CountingTarget
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    unexpected_exits: list[dict[str, Any]] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)  # fault kind -> how many were injected

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

    @contextlib.contextmanager
    def mixed(self) -> Iterator[None]:
        """What runs beside every phase's creates: approvals (on notice), replays, reads."""
        with background(0.5, self.traffic.approve_pending), background(REPLAY_EVERY_SECONDS, self.traffic.start_replay), \
                background(0.5, self.traffic.read_some):
            yield

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
        log(f"phase 1: {runs} runs (agents and flows), {kills} worker SIGKILLs at random moments")
        started = time.monotonic()
        per_burst = [runs // kills + (1 if i < runs % kills else 0) for i in range(kills)] if kills else []
        kill_log: list[dict[str, Any]] = []
        with self.mixed():
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
                self.faults["worker_sigkill"] += 1
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
            waited, left = wait_finished(self.db, phase, timeout=PHASE_WAIT_SECONDS)
        self.phases[phase] = {"kills": kill_log, "seconds_creating_and_killing": created_in,
                              "seconds_to_finish_after": waited, "unfinished_after_wait": left,
                              "kills_with_runs_running": sum(1 for k in kill_log if k["runs_running"]),
                              "seconds": round(time.monotonic() - started, 1)}
        log(f"  {len(kill_log)} kills ({self.phases[phase]['kills_with_runs_running']} while runs were running), "
            f"then all finished in {waited}s (unfinished: {left})")

    def _outage(self, phase: str, kind: str, stop: Callable[[], None], start: Callable[[], None], seconds: float) -> None:
        self.rec.phase = phase
        started = time.monotonic()
        window = self.rec.windows[phase] = Window()
        with self.mixed():
            self.steady(phase, 3.0)
            for _ in range(6):  # runs in flight when the dependency goes
                self.traffic.submit(phase, idempotent=True)
            time.sleep(0.2)
            window.start = time.monotonic()
            stop()
            stopped = time.monotonic()
            self.steady(phase, max(0.0, seconds - (time.monotonic() - stopped)))
            start()
            window.end = time.monotonic()
            self.faults[kind] += 1
            self.steady(phase, 5.0)
            self.traffic.drain()
            waited, left = wait_finished(self.db, phase, timeout=PHASE_WAIT_SECONDS)
        self.phases[phase] = {"fault": kind, "outage_seconds": round(window.end - window.start, 1),
                              "seconds_to_finish_after": waited, "unfinished_after_wait": left,
                              "seconds": round(time.monotonic() - started, 1)}
        log(f"  outage {window.end - window.start:.1f}s; phase's runs finished {waited}s after the traffic stopped "
            f"(unfinished: {left})")

    def phase_redis_kept(self, suffix: str) -> None:
        log(f"phase redis kept{suffix}: redis-server SHUTDOWN SAVE, ~{OUTAGE_SECONDS:.0f}s, restarted loading its dump")
        self._outage(f"p2_redis_kept{suffix}", "redis_outage_kept", self.redis.stop_keeping_data, self.redis.start,
                     OUTAGE_SECONDS)

    def phase_redis_emptied(self, suffix: str) -> None:
        log(f"phase redis emptied{suffix}: redis-server stopped and wiped for ~{OUTAGE_SECONDS:.0f}s")
        self._outage(f"p3_redis_emptied{suffix}", "redis_outage_emptied", self.redis.stop, self.redis.start, OUTAGE_SECONDS)

    def phase_postgres(self, suffix: str) -> None:
        phase = f"p4_postgres_restart{suffix}"
        if not self.pg.restartable:
            self.phases[phase] = {"skipped": "no PostgreSQL cluster of its own could be started; the shared one is never restarted"}
            log("phase postgres: SKIPPED (running on a dedicated database of the shared server, which is never restarted)")
            return
        assert isinstance(self.pg, OwnPostgres)
        pg = self.pg
        log(f"phase postgres{suffix}: stopped (-m fast) for ~{OUTAGE_SECONDS:.0f}s, then started")
        self._outage(phase, "postgres_restart", lambda: pg.stop("fast"), pg.start, OUTAGE_SECONDS)

    def phase_table_lock(self, suffix: str) -> None:
        """agents_run held in ACCESS EXCLUSIVE mode by a transaction of the harness's own for LOCK_SECONDS (a migration
        or a stray ``LOCK TABLE`` would do it): requests and workers meet their lock and statement bounds."""
        held: dict[str, Any] = {}

        def take() -> None:
            conn = psycopg.connect(self.pg.url, connect_timeout=5)
            conn.execute("SET lock_timeout = '10s'")
            conn.execute("LOCK TABLE agents_run IN ACCESS EXCLUSIVE MODE")
            held["conn"] = conn

        def release() -> None:
            conn = held.pop("conn", None)
            if conn is not None:
                conn.rollback()
                conn.close()

        log(f"phase table lock{suffix}: agents_run locked ACCESS EXCLUSIVE for ~{LOCK_SECONDS:.0f}s")
        self._outage(f"p5_table_lock{suffix}", "table_lock", take, release, LOCK_SECONDS)


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


def wait_replays(db: Db, timeout: float) -> tuple[float, int]:
    """Wait until no replay batch is queued or running, at most ``timeout`` s: (seconds waited, still queued/running)."""
    started = time.monotonic()
    while True:
        left = int(db.query("SELECT count(*) FROM releases_replaybatch WHERE status IN ('queued', 'running')")[0][0])
        if left == 0 or time.monotonic() - started > timeout:
            return round(time.monotonic() - started, 1), left
        time.sleep(1.0)


def count_in_file(path: Path, needle: str) -> int:
    try:
        with open(path, errors="replace") as handle:
            return sum(line.count(needle) for line in handle)
    except OSError:
        return 0


def refunds_by_run(posts: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The refund POSTs per flow run (the ``ref`` the run put in the body): more than one is a duplicate dispatch,
    whatever the Idempotency-Keys say."""
    by_ref: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for post in posts:
        ref = post["body"].get("ref") if isinstance(post["body"], dict) else None
        by_ref[str(ref)].append(post)
    return dict(by_ref)


def suite_findings(bench: Bench, base: dict[str, Any]) -> dict[str, Any]:
    """Issue #50's goals: duplicate dispatches at the counting target, deadlocks, stuck replays, notices; PASS/FAIL."""
    db, traffic, target = bench.db, bench.traffic, bench.target
    out: dict[str, Any] = {}

    # The counting target's refunds: one POST per flow run (its ref), whatever the Idempotency-Key.
    posts = target.received("/refund")
    by_ref = refunds_by_run(posts)
    nodes = {tag: (attempt, status) for tag, attempt, status in db.query(
        "SELECT r.facts->>'bench_tag', n.attempt, n.status FROM flows_flownoderun n JOIN agents_run r ON r.id = n.run_id "
        "WHERE n.node_id = 'refund'")}
    flow_rows = db.query("SELECT r.id::text, r.facts->>'bench_tag', r.status, r.terminal_reason FROM agents_run r "
                         "JOIN agents_agent a ON a.id = r.agent_id WHERE a.slug = %s", (FLOW_SLUG,))
    duplicates = [{"ref": ref, "posts": len(group), "keys": sorted({p["idempotency_key"] for p in group}),
                   "distinct_keys": len({p["idempotency_key"] for p in group}),
                   "refund_node_attempt_status": nodes.get(ref)} for ref, group in sorted(by_ref.items()) if len(group) > 1]
    finished_ok = [r for r in flow_rows if r[2] == "finished" and r[3] == "final_answer"]
    out["counting_target_refunds"] = {
        "flow_runs": len(flow_rows), "flow_runs_finished_final_answer": len(finished_ok),
        "flow_runs_by_terminal_reason": dict(Counter(r[3] or r[2] for r in flow_rows)),
        "posts": len(posts), "runs_posted": len(by_ref),
        "duplicate_dispatches": sum(len(group) - 1 for group in by_ref.values()),
        "runs_with_duplicates": duplicates,
        "finished_final_answer_without_a_post": [r[0] for r in finished_ok if r[1] not in by_ref],
        "posts_without_a_flow_run": sorted(set(by_ref) - {r[1] for r in flow_rows}),
    }

    # Deadlocks: the cluster's own log, the console's logs, and runs or flow nodes that ended on one.
    pg_log = bench.pg.log if isinstance(bench.pg, OwnPostgres) else None
    console_logs = {p.name: count_in_file(p, "deadlock detected") for p in sorted(bench.console.logs.glob("*.log"))}
    failed_runs = db.query("SELECT id::text, status, terminal_reason, left(error, 240) FROM agents_run "
                           "WHERE error ILIKE '%%deadlock%%' OR error ILIKE '%%OperationalError%%'")
    failed_nodes = db.query("SELECT run_id::text, node_id, status, left(error, 240) FROM flows_flownoderun "
                            "WHERE error ILIKE '%%deadlock%%' OR error ILIKE '%%OperationalError%%'")
    out["deadlocks"] = {
        "postgres_log_deadlock_detected": count_in_file(pg_log, "deadlock detected") if pg_log else "n/a: shared server",
        "console_logs_deadlock_detected": {k: v for k, v in console_logs.items() if v},
        "runs_failed_on_deadlock_or_operational_error": [list(r) for r in failed_runs],
        "flow_nodes_failed_on_deadlock_or_operational_error": [list(r) for r in failed_nodes],
    }

    # Replays: every batch ended (finished, failed or cancelled) within the bounded wait.
    batches = db.query("SELECT id, status, total, done FROM releases_replaybatch ORDER BY id")
    stuck = [{"batch": b, "status": st, "total": t, "done": d} for b, st, t, d in batches if st in ("queued", "running")]
    out["replays"] = {"started_by_harness": sum(1 for r in traffic.replays if r.get("batch")),
                      "attempts": len(traffic.replays),
                      "not_started": [r for r in traffic.replays if not r.get("batch")],
                      "batches_by_status": dict(Counter(b[1] for b in batches)), "stuck": stuck}

    # Notifications: each approval request's "arrived" notice reached the target (at least once).
    deliveries = db.query("SELECT d.id::text, d.request_id::text, d.status, d.attempts FROM approvals_delivery d")
    delivery_request = {d[0]: d[1] for d in deliveries}
    notices = target.received("/notify")
    per_delivery = Counter(p["delivery"] for p in notices)
    noticed = {delivery_request.get(d) for d in per_delivery} | target.noticed_requests()
    requests = db.query("SELECT id::text, tool_name, status FROM tools_approvalrequest")
    lost_notices = [{"request": r, "tool": t or "(flow approval node)", "request_status": st,
                     "deliveries": [(d[2], d[3]) for d in deliveries if d[1] == r]}
                    for r, t, st in requests if r not in noticed]
    out["notifications"] = {
        "approval_requests": len(requests), "deliveries_in_database": dict(Counter(d[2] for d in deliveries)),
        "posts": len(notices), "distinct_deliveries_received": len(per_delivery),
        "duplicate_posts_same_delivery_id": sum(n - 1 for n in per_delivery.values() if n > 1),
        "requests_never_noticed": len(lost_notices), "requests_never_noticed_by_tool": dict(Counter(x["tool"] for x in lost_notices)),
        "never_noticed": lost_notices[:100],
        "approved_without_notice_after_wait": len(traffic.approved_without_notice),
    }

    http_500 = sum(h["status_500"] for h in base["http"].values())
    lost = len(base["lost"]) + len(base["acknowledged_vs_database"]["acknowledged_but_missing_in_database"])
    dup = out["counting_target_refunds"]["duplicate_dispatches"]
    pg_deadlocks = out["deadlocks"]["postgres_log_deadlock_detected"]
    deadlock_failures = len(failed_runs) + len(failed_nodes) + (pg_deadlocks if isinstance(pg_deadlocks, int) else 0)
    out["goals"] = {
        "lost_runs": {"value": lost, "pass": lost == 0},
        "duplicate_dispatches_at_counting_target": {"value": dup, "pass": dup == 0},
        "deadlock_failures": {"value": deadlock_failures, "pass": deadlock_failures == 0,
                              "detail": f"{pg_deadlocks} 'deadlock detected' in the PostgreSQL log, {len(failed_runs)} runs "
                                        f"and {len(failed_nodes)} flow nodes ended on a deadlock/OperationalError"},
        "stuck_replay_batches": {"value": len(stuck), "pass": not stuck},
    }
    out["also"] = {"http_500": http_500, "lost_notices": len(lost_notices),
                   "duplicate_notices": out["notifications"]["duplicate_posts_same_delivery_id"],
                   "workers_exited": [e for e in bench.unexpected_exits if e["process"].startswith("worker")],
                   "processes_exited": bench.unexpected_exits}
    return out


def print_suite(result: dict[str, Any]) -> None:
    s = result["suite"]
    refunds, dl, rp, nt = s["counting_target_refunds"], s["deadlocks"], s["replays"], s["notifications"]
    print(f"faults injected: {result['faults']} (total {sum(result['faults'].values())}); runs accepted "
          f"{result['runs_accepted']} (flow runs {refunds['flow_runs']})")
    print(f"counting target: {refunds['posts']} refund POSTs for {refunds['runs_posted']} flow runs; duplicate dispatches "
          f"{refunds['duplicate_dispatches']} in {len(refunds['runs_with_duplicates'])} runs; finished without a POST "
          f"{len(refunds['finished_final_answer_without_a_post'])}; flow runs by end {refunds['flow_runs_by_terminal_reason']}")
    for dup in refunds["runs_with_duplicates"][:10]:
        print(f"   !! {dup['ref']}: {dup['posts']} POSTs, {dup['distinct_keys']} distinct keys, refund node "
              f"(attempt, status) {dup['refund_node_attempt_status']}")
    print(f"deadlocks: PostgreSQL log {dl['postgres_log_deadlock_detected']}, console logs "
          f"{dl['console_logs_deadlock_detected'] or 0}, runs failed {len(dl['runs_failed_on_deadlock_or_operational_error'])}, "
          f"flow nodes failed {len(dl['flow_nodes_failed_on_deadlock_or_operational_error'])}")
    print(f"replays: {rp['started_by_harness']} started of {rp['attempts']} tried, by status {rp['batches_by_status']}, "
          f"stuck {len(rp['stuck'])}")
    print(f"notifications: {nt['approval_requests']} approval requests, {nt['posts']} notice POSTs "
          f"({nt['distinct_deliveries_received']} deliveries, {nt['duplicate_posts_same_delivery_id']} duplicate POSTs), "
          f"never noticed {nt['requests_never_noticed']} {nt['requests_never_noticed_by_tool'] or ''}, deliveries "
          f"{nt['deliveries_in_database']}, approved without a notice after {NOTICE_WAIT_SECONDS:.0f}s "
          f"{nt['approved_without_notice_after_wait']}")
    also = s["also"]
    exits = ", ".join(f"{e['process']}={e['returncode']}" for e in also["processes_exited"]) or "none"
    print(f"HTTP 500s: {also['http_500']}; processes that exited on their own (exit codes): {exits}")
    print("-" * 100)
    for goal, g in s["goals"].items():
        print(f"{'PASS' if g['pass'] else 'FAIL'}  {goal}: {g['value']}" + (f" ({g['detail']})" if g.get("detail") else ""))
    print("=" * 100)


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
    print("-" * 100)


# --- Main -------------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help=f"The default: {QUICK} (a few minutes).")
    parser.add_argument("--full", action="store_true", help=f"Issue #50's scale: {FULL} (>= 40 faults, >= 600 runs).")
    parser.add_argument("--runs", type=int, help="Runs created during the worker kills (quick 96, full 600).")
    parser.add_argument("--kills", type=int, help="Worker SIGKILLs during phase 1 (quick 32, full 40).")
    parser.add_argument("--outages", type=int, help="Rounds of the other faults: Redis kept, Redis emptied, PostgreSQL "
                                                    "restart, table lock (quick 1, full 2).")
    parser.add_argument("--seed", type=int, default=1, help="Random seed: prompts, kill moments, victims (default 1).")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--keep", action="store_true", help="Keep the temp dir (logs, data) afterwards.")
    args = parser.parse_args()
    if args.quick and args.full:
        parser.error("--quick and --full are two presets: give one")
    for name, value in (FULL if args.full else QUICK).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.runs < 1 or args.kills < 0 or args.outages < 0:
        parser.error("--runs must be at least 1, --kills and --outages at least 0")

    def on_sigterm(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    wall = time.monotonic()
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="agentops-faults-"))
    redis = OwnRedis(workdir)
    target = CountingTarget(args.seed)
    pg: OwnPostgres | SharedPostgres | None = None
    console: Console | None = None
    failed = True
    notes: list[str] = []
    try:
        log(f"work dir {workdir}")
        target.start()
        log(f"counting target on {target.url}")
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
            TOOL_EGRESS_ALLOW=f"127.0.0.1:{target.port}",  # the counting target only: the egress guard refuses loopback
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

        versions = setup_counted_flow(console.base_url, api_key, target)
        log(f"flow {FLOW_SLUG} (refund node -> {REFUND_TOOL} -> {target.url}/refund), webhook channel -> {target.url}/notify")

        rec = Recorder()
        db = Db(pg.url)
        traffic = Traffic(console.base_url, api_key, approver_key, rec, rng, target, db)
        traffic.versions = versions
        bench = Bench(args, console, redis, pg, db, traffic, rec, rng, target)
        with background(1.0, bench.supervise):
            bench.phase_kills()
            for round_ in range(args.outages):
                suffix = f"_{round_ + 1}" if args.outages > 1 else ""
                bench.phase_redis_kept(suffix)
                bench.phase_redis_emptied(suffix)
                bench.phase_postgres(suffix)
                bench.phase_table_lock(suffix)
            rec.phase = "final"
            log(f"final: waiting for every accepted run to finish (until nothing moved for {FINAL_STALL_SECONDS:.0f}s, "
                f"at most {FINAL_WAIT_SECONDS:.0f}s), then at most {REPLAY_WAIT_SECONDS:.0f}s for every replay batch to end")
            with background(0.5, traffic.approve_pending):
                waited, left = wait_settled(db, stall=FINAL_STALL_SECONDS, cap=FINAL_WAIT_SECONDS)
            replay_waited, replays_left = wait_replays(db, REPLAY_WAIT_SECONDS)
            time.sleep(2.0)  # the last notices and refunds in flight reach the target
        bench.phases["final_wait"] = {"seconds": waited, "unfinished": left, "replay_seconds": replay_waited,
                                      "replays_unfinished": replays_left}
        traffic.pool.shutdown(wait=False, cancel_futures=True)

        result = {
            "benchmark": "faults",
            "config": {"runs": args.runs, "kills": args.kills, "outages": args.outages, "seed": args.seed,
                       "outage_seconds": OUTAGE_SECONDS, "lock_seconds": LOCK_SECONDS, "flow_share": FLOW_SHARE,
                       "notice_wait_seconds": NOTICE_WAIT_SECONDS, "final_stall_seconds": FINAL_STALL_SECONDS,
                       "final_wait_seconds": FINAL_WAIT_SECONDS, "replay_every_seconds": REPLAY_EVERY_SECONDS,
                       "create_rate_per_s": CREATE_RATE_PER_S, "max_create_attempts": MAX_CREATE_ATTEMPTS,
                       "workers": 2, "worker_concurrency": WORKER_CONCURRENCY, "settings": STACK_SETTINGS},
            "postgres": pg.how,
            "notes": notes,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
            "phases": bench.phases,
            "unexpected_exits": bench.unexpected_exits,
            "findings": findings(bench),
            "faults": dict(bench.faults),
            "runs_accepted": len(traffic.accepted),
        }
        result["suite"] = suite_findings(bench, result["findings"])
        result["wall_seconds"] = round(time.monotonic() - wall, 1)
        print_report(result)
        print_suite(result)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        log(f"wrote {out}")
        failed = False
        return 0 if all(g["pass"] for g in result["suite"]["goals"].values()) else 1
    except KeyboardInterrupt:
        log("interrupted: stopping what this script started")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if console is not None:
            console.stop_all()
        redis.stop()
        with contextlib.suppress(Exception):
            target.stop()
        if pg is not None:
            with contextlib.suppress(Exception):
                pg.teardown()
        if args.keep or failed:
            log(f"kept {workdir} (logs in {workdir / 'logs'})")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

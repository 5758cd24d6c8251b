"""The API under load (issue #14): 200 reads/s + 20 creates/s against a production-mode stack, and two peers.

    .venv/bin/python bench/api_load.py [--seconds 60] [--rounds 1] [--server-processes 2] [--table-runs 20000]
                                       [--read-rate 200] [--create-rate 20] [--keep-db]

Database: ``BENCH_DATABASE_URL`` if set (its name must contain ``bench``: it is dropped), else the server of
``DATABASE_URL`` with the database ``agentops_bench_api``, else ``postgres://postgres@127.0.0.1:5432/agentops_bench_api``.
Redis: ``REDIS_URL`` (default ``redis://127.0.0.1:6379/0``); the stack uses a queue of its own.

It migrates, seeds the demo (a tenant, its agent and an API key), then starts, on 127.0.0.1 only:

- the server: ``manage.py serve --no-worker --workers N`` (default 2 processes: one per core of a 2-core machine; a
  Python process serves on one core at a time, and the worker and PostgreSQL need the rest), each with its pool of
  ``DB_POOL_MAX_SIZE`` (10) connections;
- one Celery worker (``--pool=threads --concurrency=4``, its own pool of 10), which runs the created runs.

It creates a few runs and waits for them (their rows and events are what the reads read), copies one of them into
``--table-runs`` more rows of the tenant (a large runs table), times ``GET /api/v1/runs?limit=200`` on it, then for
``--seconds`` drives an open-loop schedule (requests start on time whatever earlier ones do; latency is counted from
the scheduled start) with an async HTTP client: ``--read-rate`` reads/s spread over a run's detail, its events page
and the runs list (``?limit=50``), plus ``--create-rate`` run creations/s. Meanwhile it samples PostgreSQL's
connections to the database. Then the same read schedule against the peer (``bench/peer_asgi.py``: one indexed query
per request in a bare ASGI app, as many processes: the floor) and against the stock DRF peer (``bench/peer_drf.py``: a
plain ``ReadOnlyModelViewSet`` with DRF's token authentication and cursor pagination over the same tables, served by
Django's own ASGI handler under uvicorn, as many processes), and prints the ratios; the goal is the console's server
CPU per request at most 1.5x the stock DRF peer's (issue #51). ``--rounds`` repeats both phases; the table
gives min / median / max over rounds. Results: stdout and ``bench/results/api_load.json``.

Bounded: at most ``--seconds`` × rate requests per phase, at most 2000 in flight, 10 s timeout each. Every process it
starts is stopped by its PID (its own process group) at the end, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "api_load.json"
DEFAULT_DB = "agentops_bench_api"
DEMO_KEY = "aok_be0cbe0c_api-load-bench-secret-key-0123456789"
MAX_IN_FLIGHT = 2000
TIMEOUT = 10.0
READS = ("run_detail", "events_page", "runs_list")
RUN = {"agent": "order-assistant", "input": "where is order O202411280001?"}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def database_url(default_db: str = DEFAULT_DB) -> str:
    explicit = os.environ.get("BENCH_DATABASE_URL")
    if explicit:
        if "bench" not in urlsplit(explicit).path:
            sys.exit("BENCH_DATABASE_URL's database name must contain 'bench' (the benchmark drops it).")
        return explicit
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    if not base.startswith(("postgres://", "postgresql://")):
        base = "postgres://postgres@127.0.0.1:5432/postgres"
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{default_db}"))


def stack_env(url: str, workdir: Path, queue: str, demo_key: str) -> dict[str, str]:
    """The environment of a production-mode stack of our own: its database, Redis, queue and demo key."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url, REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), DEBUG="false",
        HTTPS_ONLY="false", SECRET_KEY=secrets.token_urlsafe(40), AGENTOPS_VAR_DIR=str(workdir),
        AGENTOPS_QUEUE=queue, PROMETHEUS_MULTIPROC_DIR=str(workdir / "prometheus"),
        DEMO_API_KEY=demo_key, DEMO_PASSWORD="bench-password-0123",
        API_THROTTLE_RATE="1000000/min", RUN_CREATE_THROTTLE_RATE="1000000/min",  # on (their cost counts), never tripping
        UVICORN_LOG_LEVEL="warning", LOG_LEVEL="WARNING",
    )
    return env


def admin_url(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/postgres"))


def db_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


class Processes:
    """What this benchmark started: each in its own process group, stopped by PID."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        logfile = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(argv, cwd=ROOT, env={**self.env, **(env or {})}, stdout=logfile, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=15)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def check(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")


def run_manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def wait_healthy(base: str, procs: Processes, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        procs.check()
        try:
            response = httpx.get(f"{base}/healthz", timeout=3)
            if response.status_code == 200 and response.json().get("status") == "ok":
                return
            last = response.text[:300]
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise RuntimeError(f"{base} not healthy after {timeout}s: {last}")


def wait_up(base: str, path: str, procs: Processes, timeout: float = 60, key: str | None = None) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}{path}", headers=headers, timeout=3).status_code == 200:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{base}{path} did not answer 200 in {timeout}s")


def cpu_seconds(root_pid: int) -> float:
    """User + system CPU seconds of a process and its children (uvicorn's worker processes), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [root_pid]
    with contextlib.suppress(OSError):
        children = Path(f"/proc/{root_pid}/task/{root_pid}/children").read_text().split()
        pids += [int(c) for c in children]
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def stolen_seconds() -> float:
    """CPU seconds the hypervisor gave to others (``steal`` in /proc/stat, all CPUs): on a shared virtual machine
    the same code answers slower when this grows, so each phase reports it beside its results."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    return 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


class ConnectionSampler:
    """PostgreSQL connections to the benchmark's database, sampled every 0.25 s; keeps the peak."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(admin_url(self.url), autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [db_name(self.url)]).fetchone()
                self.peak = max(self.peak, int(row[0]) if row else 0)
                self._stop.wait(0.25)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class TransportError(Exception):
    pass


class RawClient:
    """A minimal HTTP/1.1 client over persistent asyncio connections to 127.0.0.1.

    httpx's AsyncClient costs about a millisecond of CPU per request; at 220 requests/s on a shared 2-core machine the
    load generator itself became the bottleneck (its lag showed in every latency, the bare peer's too). This one
    writes the request line and headers and reads the status, headers and body (Content-Length or chunked): tens of
    microseconds per request.
    """

    def __init__(self, base: str, headers: dict[str, str], max_connections: int) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self.slots = asyncio.Semaphore(max_connections)

    async def request(self, method: str, path: str, body: bytes = b"") -> int:
        async with self.slots:
            now = time.monotonic()
            while self.idle and self.idle[0][2] < now - 2.0:  # idle for 2 s (oldest first): uvicorn may be closing it
                self.idle.pop(0)[1].close()
            reader, writer, _ = self.idle.pop() if self.idle else (*await asyncio.open_connection(self.host, self.port), 0.0)
            try:
                head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self.extra}"
                if body:
                    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                writer.write((head + "\r\n").encode() + body)
                status, keep = await self._response(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                writer.close()
                raise TransportError(type(exc).__name__) from exc
            except BaseException:
                writer.close()
                raise
            if keep:
                self.idle.append((reader, writer, time.monotonic()))
            else:
                writer.close()
            return status

    @staticmethod
    async def _response(reader: asyncio.StreamReader) -> tuple[int, bool]:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        if "content-length" in headers:
            await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await reader.readexactly(size + 2)
                if size == 0:
                    break
        return status, headers.get("connection", "").lower() != "close"

    def close(self) -> None:
        for _reader, writer, _at in self.idle:
            writer.close()


async def drive(base: str, key: str | None, run_ids: list[str], seconds: float, read_rate: float,
                create_rate: float) -> dict[str, Any]:
    """An open-loop schedule: reads (round-robin over READS) and creates, each started at its time."""
    paths = {"run_detail": lambda i: f"/api/v1/runs/{run_ids[i % len(run_ids)]}",
             "events_page": lambda i: f"/api/v1/runs/{run_ids[i % len(run_ids)]}/events?after=0",
             "runs_list": lambda i: "/api/v1/runs?limit=50"}
    schedule: list[tuple[float, str, int]] = [(i / read_rate, READS[i % len(READS)], i // len(READS))
                                              for i in range(int(seconds * read_rate))]
    schedule += [(i / create_rate, "create", i) for i in range(int(seconds * create_rate))]
    schedule.sort()
    latencies: dict[str, list[float]] = defaultdict(list)
    statuses: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    in_flight = 0
    skipped = 0
    lags: list[float] = []
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    create_body = json.dumps(RUN).encode()
    http = RawClient(base, headers, max_connections=MAX_IN_FLIGHT)
    try:

        async def one(at: float, kind: str, i: int, start: float) -> None:
            nonlocal in_flight
            in_flight += 1
            try:
                if kind == "create":
                    status = await asyncio.wait_for(http.request("POST", "/api/v1/runs", create_body), TIMEOUT)
                else:
                    status = await asyncio.wait_for(http.request("GET", paths[kind](i)), TIMEOUT)
                statuses[kind][str(status)] += 1
            except TransportError as exc:
                statuses[kind][f"transport:{exc}"] += 1
            except TimeoutError:
                statuses[kind]["timeout"] += 1
            except asyncio.CancelledError:
                statuses[kind]["unfinished"] += 1
            finally:
                in_flight -= 1
                latencies[kind].append((time.perf_counter() - (start + at)) * 1000)

        tasks = []
        start = time.perf_counter()
        for at, kind, i in schedule:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if in_flight >= MAX_IN_FLIGHT:
                skipped += 1
                continue
            lags.append((time.perf_counter() - (start + at)) * 1000)
            tasks.append(asyncio.create_task(one(at, kind, i, start)))
        # Bounded: whatever has not answered TIMEOUT + 5 s after the schedule ended is cancelled and counted.
        _done, pending = await asyncio.wait(tasks, timeout=max(0.0, start + seconds + TIMEOUT + 5 - time.perf_counter()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        elapsed = time.perf_counter() - start
    finally:
        http.close()
    result: dict[str, Any] = {"elapsed_s": round(elapsed, 1), "skipped_in_flight_cap": skipped, "endpoints": {},
                              "client_lag_p95_ms": round(percentile(lags, 95), 1),
                              "load_average_1m_after": round(os.getloadavg()[0], 2)}
    for kind in (*READS, "create"):
        values = latencies.get(kind, [])
        if not values:
            continue
        ok = sum(n for code, n in statuses[kind].items() if code.startswith("2"))
        result["endpoints"][kind] = {
            "requests": len(values), "ok": ok, "errors": len(values) - ok, "statuses": dict(statuses[kind]),
            "p50_ms": round(percentile(values, 50), 1), "p95_ms": round(percentile(values, 95), 1),
            "p99_ms": round(percentile(values, 99), 1), "rate_per_s": round(len(values) / elapsed, 1),
        }
    return result


def seed_table(url: str, template_run: str, count: int) -> None:
    """``count`` copies of a finished run (same tenant, agent, session), spread over the past, as a large table."""
    with psycopg.connect(url, autocommit=True) as conn:
        columns = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'agents_run' ORDER BY ordinal_position")]
        chosen = {"id": "gen_random_uuid()", "created_at": "now() - g * interval '7 seconds'", "idempotency_key": "''",
                  "request_digest": "''"}
        select = ", ".join(chosen.get(c, c) for c in columns)
        conn.execute(f"INSERT INTO agents_run ({', '.join(columns)}) SELECT {select} FROM agents_run, "
                     "generate_series(1, %s) AS g WHERE agents_run.id = %s", [count, template_run])
        conn.execute("ANALYZE agents_run")


def stock_drf_token(env: dict[str, str], url: str) -> str:
    """The stock DRF peer's table (DRF's ``authtoken``) and a token for the demo tenant's first user."""
    run_manage({**env, "DJANGO_SETTINGS_MODULE": "peer_drf_settings", "PYTHONPATH": str(ROOT / "bench")}, "migrate",
               "authtoken", "--noinput")
    key = secrets.token_hex(20)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO authtoken_token (key, user_id, created) SELECT %s, min(id), now() FROM auth_user", [key])
    return key


def time_big_page(base: str, key: str, n: int = 30) -> dict[str, float]:
    values = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT) as http:
        for i in range(n + 3):
            started = time.perf_counter()
            response = http.get("/api/v1/runs?limit=200")
            took = (time.perf_counter() - started) * 1000
            if response.status_code != 200 or len(response.json()["results"]) != 200:
                raise RuntimeError(f"runs?limit=200: {response.status_code} {response.text[:300]}")
            if i >= 3:
                values.append(took)
    return {"p50_ms": round(percentile(values, 50), 1), "p95_ms": round(percentile(values, 95), 1), "n": n}


@contextlib.contextmanager
def database(url: str, keep: bool) -> Iterator[None]:
    name = db_name(url)
    with psycopg.connect(admin_url(url), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield
    finally:
        if not keep:
            with psycopg.connect(admin_url(url), autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def summary(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per phase (default 60; at most 120)")
    parser.add_argument("--rounds", type=int, default=1, help="console + peer phases, repeated (default 1; at most 5)")
    parser.add_argument("--server-processes", type=int, default=2)
    parser.add_argument("--read-rate", type=float, default=200.0)
    parser.add_argument("--create-rate", type=float, default=20.0)
    parser.add_argument("--table-runs", type=int, default=20_000, help="rows copied into the runs table before the load")
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args()
    seconds = max(1.0, min(args.seconds, 120.0))
    rounds = max(1, min(args.rounds, 5))
    read_rate, create_rate = min(args.read_rate, 1000.0), min(args.create_rate, 100.0)

    # SIGTERM (e.g. `timeout`) ends the run through the finally blocks below: every process started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    url = database_url()
    workdir = Path(tempfile.mkdtemp(prefix="agentops-api-load-"))
    port, peer_port = free_port(), free_port()
    env = stack_env(url, workdir, f"agentops-bench-api-{port}", DEMO_KEY)
    procs = Processes(workdir, env)
    base, peer_base = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
    result: dict[str, Any] = {"seconds": seconds, "rounds": [], "server_processes": args.server_processes,
                              "read_rate": read_rate, "create_rate": create_rate, "table_runs": args.table_runs}
    try:
        with database(url, args.keep_db):
            log(f"database {db_name(url)}: migrate, seed_demo")
            run_manage(env, "migrate", "--noinput")
            run_manage(env, "seed_demo")
            procs.start("worker", [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=threads",
                                   "--concurrency=4", "-Q", env["AGENTOPS_QUEUE"], "--without-gossip", "--without-mingle",
                                   "--loglevel=WARNING", "-n", f"bench-api-{port}@%h"])
            procs.start("server", [sys.executable, "manage.py", "serve", "--no-worker", "--port", str(port),
                                   "--workers", str(args.server_processes)])
            wait_healthy(base, procs)
            log(f"stack up at {base} ({args.server_processes} server processes, 1 worker)")
            run_ids = []
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {DEMO_KEY}"}, timeout=TIMEOUT) as http:
                for _ in range(6):
                    created = http.post("/api/v1/runs", json=RUN)
                    created.raise_for_status()
                    run_ids.append(created.json()["id"])
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    if all(http.get(f"/api/v1/runs/{r}").json()["status"] == "finished" for r in run_ids):
                        break
                    time.sleep(0.5)
                else:
                    raise RuntimeError("the seed runs did not finish in 60 s")
            with psycopg.connect(url) as conn:
                tenant_row = conn.execute("SELECT tenant_id FROM agents_run WHERE id = %s", [run_ids[0]]).fetchone()
                events = conn.execute("SELECT count(*) FROM agents_runevent WHERE run_id = %s", [run_ids[0]]).fetchone()
            assert tenant_row is not None and events is not None
            log(f"{len(run_ids)} runs finished ({events[0]} events each); copying {args.table_runs} more rows")
            seed_table(url, run_ids[0], args.table_runs)
            drf_key = stock_drf_token(env, url)
            uvicorn = [sys.executable, "-m", "uvicorn", "--app-dir", "bench", "--host", "127.0.0.1", "--port", str(peer_port),
                       "--workers", str(args.server_processes), "--log-level", "warning"]
            peer_apps = [("peer", [*uvicorn, "peer_asgi:app"], {"PEER_DATABASE_URL": url, "PEER_TENANT_ID": str(tenant_row[0])}, None),
                         ("drf", [*uvicorn, "peer_drf:app"], {"PEER_TENANT_ID": str(tenant_row[0]), "PYTHONPATH": str(ROOT)}, drf_key)]
            result["big_page"] = time_big_page(base, DEMO_KEY)
            log(f"GET /api/v1/runs?limit=200 on {args.table_runs + len(run_ids)} runs: {result['big_page']}")
            for number in range(1, rounds + 1):
                log(f"round {number}: console, {read_rate:g} reads/s + {create_rate:g} creates/s for {seconds:g} s")
                server_cpu, worker_cpu = cpu_seconds(procs.procs["server"].pid), cpu_seconds(procs.procs["worker"].pid)
                stolen = stolen_seconds()
                with ConnectionSampler(url) as sampler:
                    console = asyncio.run(drive(base, DEMO_KEY, run_ids, seconds, read_rate, create_rate))
                console["stolen_cpu_s"] = round(stolen_seconds() - stolen, 1)
                console["peak_db_connections"] = sampler.peak
                requests = sum(e["requests"] for e in console["endpoints"].values())
                answered = requests - sum(e["errors"] for e in console["endpoints"].values())
                spent = cpu_seconds(procs.procs["server"].pid) - server_cpu
                console["server_cpu_ms_per_request"] = round(spent * 1000 / max(1, requests), 2)
                # a refusal costs next to nothing: per answered request is the figure that compares across rounds
                console["server_cpu_ms_per_answered"] = round(spent * 1000 / max(1, answered), 2)
                console["worker_cpu_s"] = round(cpu_seconds(procs.procs["worker"].pid) - worker_cpu, 1)
                procs.check()
                peers = {}
                for name, argv, peer_env, key in peer_apps:
                    log(f"round {number}: {name}, {read_rate:g} reads/s for {seconds:g} s")
                    procs.start(name, argv, env=peer_env)
                    wait_up(peer_base, f"/api/v1/runs/{run_ids[0]}", procs, key=key)
                    peer_cpu, stolen = cpu_seconds(procs.procs[name].pid), stolen_seconds()
                    peers[name] = asyncio.run(drive(peer_base, key, run_ids, seconds, read_rate, 0))
                    peers[name]["stolen_cpu_s"] = round(stolen_seconds() - stolen, 1)
                    peers[name]["server_cpu_ms_per_request"] = round(
                        (cpu_seconds(procs.procs[name].pid) - peer_cpu) * 1000
                        / max(1, sum(e["requests"] for e in peers[name]["endpoints"].values())), 2)
                    procs.stop(name)
                peer, drf = peers["peer"], peers["drf"]
                result["rounds"].append({"console": console, "peer": peer, "drf": drf})
                print_round(number, console, peer, drf)
    finally:
        procs.stop_all()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print_summary(result)
    log(f"logs in {workdir}; results in {RESULTS.relative_to(ROOT)}")
    return 0


def print_round(number: int, console: dict[str, Any], peer: dict[str, Any], drf: dict[str, Any]) -> None:
    print(f"\nround {number}: console {console['elapsed_s']} s, peak {console['peak_db_connections']} DB connections, "
          f"server CPU {console['server_cpu_ms_per_request']} ms/request, {console['server_cpu_ms_per_answered']} per "
          f"answered one (bare peer {peer['server_cpu_ms_per_request']}, stock DRF {drf['server_cpu_ms_per_request']}: "
          f"x{console['server_cpu_ms_per_request'] / max(0.01, drf['server_cpu_ms_per_request']):.2f}), "
          f"worker CPU {console['worker_cpu_s']} s, load generator lag p95 {console['client_lag_p95_ms']} ms "
          f"(peer phase {peer['client_lag_p95_ms']} ms), CPU stolen by the hypervisor {console['stolen_cpu_s']} s "
          f"(peer phase {peer['stolen_cpu_s']} s)")
    print(f"{'endpoint':<12} {'req':>6} {'err':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} | {'peer p50':>8} "
          f"{'peer p95':>8} {'peer p99':>8} {'err':>4} | p50 x  p95 x")
    for kind in (*READS, "create"):
        c = console["endpoints"].get(kind)
        if c is None:
            continue
        p = peer["endpoints"].get(kind)
        peer_cols = (f"{p['p50_ms']:>8.1f} {p['p95_ms']:>8.1f} {p['p99_ms']:>8.1f} {p['errors']:>4} | "
                     f"{c['p50_ms'] / p['p50_ms']:>5.1f} {c['p95_ms'] / p['p95_ms']:>5.1f}") if p else f"{'':>31} |"
        print(f"{kind:<12} {c['requests']:>6} {c['errors']:>5} {c['p50_ms']:>8.1f} {c['p95_ms']:>8.1f} {c['p99_ms']:>8.1f} | "
              f"{peer_cols}")
        if c["errors"]:
            print(f"{'':<12} statuses: {c['statuses']}")


def print_summary(result: dict[str, Any]) -> None:
    rounds = result["rounds"]
    if not rounds:
        return
    print(f"\nsummary over {len(rounds)} round(s) (min / median / max)")
    for kind in (*READS, "create"):
        if kind not in rounds[0]["console"]["endpoints"]:
            continue
        series = {m: [r["console"]["endpoints"][kind][m] for r in rounds] for m in ("p50_ms", "p95_ms", "p99_ms", "errors")}
        line = f"{kind:<12} p50 {summary(series['p50_ms'])}  p95 {summary(series['p95_ms'])}  p99 {summary(series['p99_ms'])}"
        line += f"  errors {summary([float(e) for e in series['errors']])}"
        if kind in rounds[0]["peer"]["endpoints"]:
            ratio = [r["console"]["endpoints"][kind]["p50_ms"] / r["peer"]["endpoints"][kind]["p50_ms"] for r in rounds]
            line += f"  p50 vs peer x{summary(ratio)}"
        print(line)
    print(f"peak DB connections: {summary([float(r['console']['peak_db_connections']) for r in rounds])}")
    print(f"server CPU ms/request: console {summary([r['console']['server_cpu_ms_per_request'] for r in rounds])}, "
          f"stock DRF {summary([r['drf']['server_cpu_ms_per_request'] for r in rounds])}, "
          f"bare peer {summary([r['peer']['server_cpu_ms_per_request'] for r in rounds])}")
    ratio = [r["console"]["server_cpu_ms_per_request"] / r["drf"]["server_cpu_ms_per_request"] for r in rounds]
    print(f"server CPU per request, console / stock DRF: x{summary(ratio)} (goal <= 1.5)")
    for kind in READS:
        print(f"{kind:<12} stock DRF p50 {summary([r['drf']['endpoints'][kind]['p50_ms'] for r in rounds])}  "
              f"p95 {summary([r['drf']['endpoints'][kind]['p95_ms'] for r in rounds])}  "
              f"errors {summary([float(r['drf']['endpoints'][kind]['errors']) for r in rounds])}")
    print(f"server CPU ms per answered request: {summary([r['console']['server_cpu_ms_per_answered'] for r in rounds])}")
    print(f"CPU stolen by the hypervisor, s per console phase: {summary([r['console']['stolen_cpu_s'] for r in rounds])}")


if __name__ == "__main__":
    sys.exit(main())

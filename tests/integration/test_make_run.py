"""What a newcomer sees from ``make run``: its three steps (migrate, seed_demo, serve) as the Makefile runs them.

A fresh embedded install on a free PORT: seed_demo's curl example names that port, and the server's console shows
no deprecation warning (uvicorn's websocket implementation), no kombu start-up warning, and no INFO lines for the
periodic housekeeping tasks (the sweeper runs every second here) — while a run still goes through the worker.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.live_stack import ROOT, _free_port

pytestmark = pytest.mark.integration


def _env(var_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "HTTPS_ONLY")}
    env.update(DEBUG="true", PORT=str(port), AGENTOPS_VAR_DIR=str(var_dir), PYTHONUNBUFFERED="1",
               SWEEP_INTERVAL_SECONDS="1", LOG_LEVEL="INFO")
    env.pop("HOST", None)
    return env


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def _wait_healthy(base: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(f"{base}/healthz", timeout=3).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"serve did not become healthy:\n{log.read_text()[-3000:]}")


def test_make_run_prints_the_right_port_and_a_quiet_console(tmp_path: Path) -> None:
    port = _free_port()
    env = _env(tmp_path, port)
    base = f"http://127.0.0.1:{port}"

    # make migrate, make seed
    _manage(env, "migrate", "--noinput")
    seeded = _manage(env, "seed_demo")
    assert f"{base}/api/v1/runs" in seeded, seeded
    assert ":8000" not in seeded
    api_key = re.search(r"(aok_[0-9a-f]{8}_\S+)", seeded)
    assert api_key, seeded

    # make run: serve, started and stopped by its PID
    log = tmp_path / "serve.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "manage.py", "serve"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(base, proc, log)
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {api_key.group(1)}"}, timeout=20) as http:
            response = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": "where is order O202411280001?"})
            assert response.status_code == 202, response.text
            run_id = response.json()["id"]
            deadline = time.monotonic() + 30
            while http.get(f"/api/v1/runs/{run_id}").json()["status"] != "finished":
                assert time.monotonic() < deadline, "the demo run did not finish"
                time.sleep(0.3)
        time.sleep(4)  # several sweeps (SWEEP_INTERVAL_SECONDS=1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    console = log.read_text()

    assert f"Serving the Agent Operations Console at http://127.0.0.1:{port}/" in console, console
    assert "DeprecationWarning" not in console and "deprecated" not in console.lower(), console
    assert "No hostname was supplied" not in console, console
    assert "sweep_runs" not in console and "sweep-runs" not in console, console

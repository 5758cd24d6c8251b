"""bench/faults.py's counting target counts what reached it: two refund POSTs of one run are a duplicate dispatch
whatever their Idempotency-Keys, and an approval notice names its request through the console's link."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def faults() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_faults", ROOT / "bench" / "faults.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def target(faults: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(faults, "REFUND_ANSWER_SECONDS", (0.0, 0.0))
    server = faults.CountingTarget(seed=1)
    server.start()
    yield server
    server.stop()


def test_two_refunds_of_one_run_with_different_keys_are_one_duplicate(faults: ModuleType, target: Any) -> None:
    body = {"order_id": "O202411280001", "amount": "250.00", "reason": "damaged cup", "ref": "p1-0007"}
    first = httpx.post(f"{target.url}/refund", json=body, headers={"Idempotency-Key": "run:3:fl:run:refund"})
    again = httpx.post(f"{target.url}/refund", json=body, headers={"Idempotency-Key": "run:4:fl:run:refund"})
    other = httpx.post(f"{target.url}/refund", json={**body, "ref": "p1-0008"}, headers={"Idempotency-Key": "x"})
    assert [r.status_code for r in (first, again, other)] == [200, 200, 200]
    assert first.json()["amount"] == "250.00"  # the flow's summary node reads the answer
    groups = faults.refunds_by_run(target.received("/refund"))
    assert {ref: len(posts) for ref, posts in groups.items()} == {"p1-0007": 2, "p1-0008": 1}
    assert [p["idempotency_key"] for p in groups["p1-0007"]] == ["run:3:fl:run:refund", "run:4:fl:run:refund"]


def test_a_notice_names_its_request_and_its_delivery(faults: ModuleType, target: Any) -> None:
    request_id = "40a830f5-45cb-4eb4-8e7d-568a25ea7b8d"
    slack = {"text": f"Approval needed: http://127.0.0.1:8000/approvals/{request_id}/", "blocks": []}
    for _ in range(2):  # at least once: the same delivery sent again
        httpx.post(f"{target.url}/notify", content=json.dumps(slack), headers={"X-AgentOps-Delivery": "17"})
    assert target.noticed_requests() == {request_id}
    assert [p["delivery"] for p in target.received("/notify")] == ["17", "17"]

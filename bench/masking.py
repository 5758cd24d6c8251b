"""What masking costs per string and per event payload: mask_text with its gates against every pattern run.

    .venv/bin/python bench/masking.py            # --rounds 5 --number 5000

No database, no network: audit.masking alone, in this process. Each round times, interleaved, the gated path
(``mask_text``, what every event, audit row and frame goes through) and the ungated one (every substitution run on
every string, what mask_text did before its gates), over the same strings: words, ids, an order number, prose, and
strings that do hold something to mask. Prints min / median / max microseconds per call and the ratio per round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from audit import masking  # noqa: E402  (after sys.path)

STRINGS = {
    "word": "shipped",
    "id": "lookup_order",
    "order number": "O202411280001",
    "sentence (85 chars)": "Your order O202411280001 has shipped with SF Express and should arrive within 2 days.",
    "phone in text": "call me on 13812345678 please",
    "secret in text": "password=hunter2 and token: abc123xyz",
}
PAYLOADS = [  # the shapes of a run's events: a model call, a tool call, its result, an answer, usage
    {"type": "model.call", "model": "planner", "messages": 4, "tools": ["lookup_order", "track_shipment", "refund"]},
    {"name": "lookup_order", "arguments": {"order_id": "O202411280001"}, "call_id": "call_abc123", "span": "9f8e7d6c"},
    {"result": {"order_id": "O202411280001", "status": "shipped", "carrier": "SF Express", "amount": 129.0,
                "items": [{"sku": "A-100", "qty": 1}]}},
    {"text": "Your order O202411280001 has shipped with SF Express and should arrive within 2 days.",
     "finish_reason": "stop"},
    {"usage": {"prompt_tokens": 120, "completion_tokens": 30}, "latency_ms": 3.2, "status": "ok"},
]


def _ungated_text(text: str, keep: Any = ()) -> str:
    return masking._mask_patterns(text, masking._keep_set(keep)) if text and isinstance(text, str) else text


def _ungated_value(obj: Any) -> Any:
    """mask_value as it is (the sensitive keys, the structure), with every pattern run on every string."""
    gated = masking.mask_text
    masking.mask_text = _ungated_text  # type: ignore[assignment]  # what _mask calls for each string
    try:
        return masking.mask_value(obj)
    finally:
        masking.mask_text = gated


def _time(fn: Callable[[], Any], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--number", type=int, default=5000, help="calls per measurement")
    args = parser.parse_args()
    rounds, number = max(3, min(args.rounds, 20)), max(100, min(args.number, 100_000))
    cases: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        name: ((lambda t=text: masking.mask_text(t)), (lambda t=text: _ungated_text(t))) for name, text in STRINGS.items()
    }
    cases["event payload (mean of 5)"] = (lambda: masking.mask_value(PAYLOADS),
                                          lambda: _ungated_value(PAYLOADS))
    for gated, ungated in cases.values():
        assert gated() == ungated(), "the gates changed a result"
    results: dict[str, dict[str, list[float]]] = {name: {"gated": [], "ungated": []} for name in cases}
    for _ in range(rounds):
        for name, (gated, ungated) in cases.items():
            scale = len(PAYLOADS) if name.startswith("event") else 1
            results[name]["ungated"].append(_time(ungated, number) / scale)
            results[name]["gated"].append(_time(gated, number) / scale)
    print(f"{'us per call (min / median / max)':<28} {'gated (mask_text)':>24} {'every pattern':>24} {'ratio (median)':>15}")
    for name, r in results.items():
        ratios = [g / u for g, u in zip(r["gated"], r["ungated"], strict=True)]

        def fmt(values: list[float]) -> str:
            return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"

        print(f"{name:<28} {fmt(r['gated']):>24} {fmt(r['ungated']):>24} {statistics.median(ratios):>14.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

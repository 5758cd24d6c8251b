"""``celery -A config worker ...`` with the benchmark's ``bench.echo`` tool registered (bench/flow_overhead.py, (b))."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.flow_overhead import register_echo
from config.celery import app

if __name__ == "__main__":
    register_echo()
    app.worker_main(sys.argv[1:])

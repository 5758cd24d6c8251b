"""``manage.py serve``: the ASGI server (uvicorn), plus the in-process worker in embedded mode."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Serve the console over ASGI (HTTP + websockets). In embedded mode also runs a Celery worker in-process."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=None, help="Default: $PORT or 8000.")
        parser.add_argument("--no-worker", action="store_true", help="Do not start the embedded worker.")

    def handle(self, *args: Any, host: str, port: int | None, no_worker: bool, **options: Any) -> None:
        import uvicorn

        if port is None:
            raw = os.environ.get("PORT", "8000")
            if not raw.isdigit() or not 0 < int(raw) < 65536:
                raise CommandError(f"PORT must be a TCP port number (1-65535), got {raw!r}.")
            port = int(raw)
        if settings.EMBEDDED and not no_worker:
            from config.embedded import start_embedded_worker  # only the embedded mode starts Celery in this process

            start_embedded_worker()
        mode = "embedded (SQLite/in-process worker)" if settings.EMBEDDED else "production (separate workers)"
        self.stdout.write(f"Serving the Agent Operations Console at http://{host}:{port}/ — mode: {mode}")
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it: exit normally so exit handlers
        # (e.g. flushing OpenTelemetry spans) still run.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        uvicorn.run("config.asgi:application", host=host, port=port, ws="websockets", lifespan="off",
                    log_level=os.environ.get("UVICORN_LOG_LEVEL", "warning"), proxy_headers=False)

"""``manage.py serve``: the ASGI server (uvicorn), plus the in-process worker in embedded mode."""

from __future__ import annotations

import signal
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

#: uvicorn's websocket implementation on the websockets library (its legacy ``websockets`` one is deprecated).
WS_IMPLEMENTATION = "websockets-sansio"


class Command(BaseCommand):
    help = "Serve the console over ASGI (HTTP + websockets). In embedded mode also runs a Celery worker in-process."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default=settings.SERVE_HOST, help="Default: $HOST or 127.0.0.1.")
        parser.add_argument("--port", type=int, default=settings.SERVE_PORT, help="Default: $PORT or 8000.")
        parser.add_argument("--no-worker", action="store_true", help="Do not start the embedded worker.")
        parser.add_argument("--workers", type=int, default=settings.SERVE_WORKERS,
                            help="Server processes (production mode only). Default: $SERVE_WORKERS or 1.")

    def handle(self, *args: Any, host: str, port: int, no_worker: bool, workers: int, **options: Any) -> None:
        import uvicorn

        if not 0 < port < 65536:
            raise CommandError(f"--port must be a TCP port number (1-65535), got {port}.")
        if workers < 1:
            raise CommandError(f"--workers must be at least 1, got {workers}.")
        if settings.EMBEDDED and workers > 1:
            raise CommandError("Embedded mode serves from one process (its worker and SQLite live there); "
                               "set REDIS_URL and DATABASE_URL to run several server processes.")
        if settings.EMBEDDED and not no_worker:
            from config.embedded import start_embedded_worker  # only the embedded mode starts Celery in this process

            start_embedded_worker()
        mode = "embedded (SQLite/in-process worker)" if settings.EMBEDDED else "production (separate workers)"
        processes = f", {workers} server processes" if workers > 1 else ""
        self.stdout.write(f"Serving the Agent Operations Console at http://{host}:{port}/ — mode: {mode}{processes}")
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it: exit normally so exit handlers
        # (e.g. flushing OpenTelemetry spans) still run.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        uvicorn.run("config.asgi:served_application", factory=True, host=host, port=port, ws=WS_IMPLEMENTATION, lifespan="off",
                    log_level=settings.UVICORN_LOG_LEVEL, proxy_headers=False, workers=workers)

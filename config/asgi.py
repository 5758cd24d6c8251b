"""ASGI entry point: HTTP through Django's own ASGI handler, websockets through Channels.

What is ours wraps Django's handler as plain ASGI middleware (docs/decisions/server-layout.md): the body limit, the
admission limit (a 503 before Django past MAX_CONCURRENT_REQUESTS) and the stream thread (an open event stream holds no
thread of its own).
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from agents.routing import websocket_urlpatterns  # noqa: E402
from console.routing import websocket_urlpatterns as console_websocket_urlpatterns  # noqa: E402
from core.admission import AdmissionLimit  # noqa: E402
from core.body_limit import BodyLimit  # noqa: E402
from core.stream_thread import StreamThread  # noqa: E402
from tenants.ws_auth import WebsocketAuthMiddleware  # noqa: E402

application = ProtocolTypeRouter(
    {
        # uvicorn has no body limit; past MAX_CONCURRENT_REQUESTS in progress, a 503 before Django (core/admission.py)
        "http": AdmissionLimit(BodyLimit(StreamThread(django_asgi_app), limit=settings.DATA_UPLOAD_MAX_MEMORY_SIZE),
                               limit=settings.MAX_CONCURRENT_REQUESTS),
        "websocket": WebsocketAuthMiddleware(URLRouter(websocket_urlpatterns + console_websocket_urlpatterns)),
    }
)


def served_application() -> ProtocolTypeRouter:
    """``manage.py serve``'s app factory, called once in each server process after this module is imported: the
    process's code is loaded, so it goes out of the garbage collector's way (config/heap.py), then the app."""
    from config.heap import freeze_startup_heap

    freeze_startup_heap()
    return application

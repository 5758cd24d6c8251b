"""Django's ASGI handler with the middleware chain run synchronously: one thread hop per request, not twenty.

Django's ``ASGIHandler`` loads the middleware in async mode. Every ``MiddlewareMixin`` middleware is async-capable,
so each runs its ``process_request`` and ``process_response`` through ``sync_to_async`` — a hop to the request's
thread and back through the event loop, twice per middleware — and ``WhiteNoiseMiddleware`` (sync only) sits in the
middle of the stack, so the chain goes sync → async (``async_to_sync``) → sync again for the view. Profiled under load
(``bench/api_profile.py``, bench/README.md "api_load.py"), those hops were most of the difference between a view's
CPU in-process and over HTTP.

Every middleware in ``settings.MIDDLEWARE`` and every HTTP view is synchronous, so here the chain is loaded in sync
mode (as under WSGI) and the whole of it — middleware, view, exception handling, response logging — runs in one
``sync_to_async`` call on the request's thread-sensitive thread (Django's ``ThreadSensitiveContext`` per request is
kept, so the ``request_started`` receivers, the chain and ``response.close()`` still share one thread and its
database connection). Streaming responses (the SSE run streams' async iterators) are still sent by the async
handler afterwards, exactly as before. An async view or middleware would still work (Django adapts it with
``async_to_sync``), only slower: keep HTTP views and middleware synchronous (websockets go through Channels).
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler


class SyncChainASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)

    async def get_response_async(self, request: Any) -> Any:
        # BaseHandler.get_response: set the urlconf, run the chain, attach request.close, log 4xx/5xx — on one thread.
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def get_asgi_application() -> SyncChainASGIHandler:
    """``django.core.asgi.get_asgi_application`` with the synchronous middleware chain."""
    import django

    django.setup(set_prefix=False)
    return SyncChainASGIHandler()

"""Django's ASGI handler with the middleware chain run synchronously, on threads kept from one request to the next.

Django's ``ASGIHandler`` loads the middleware in async mode. Every ``MiddlewareMixin`` middleware is async-capable,
so each runs its ``process_request`` and ``process_response`` through ``sync_to_async`` — a hop to the request's
thread and back through the event loop, twice per middleware — and ``WhiteNoiseMiddleware`` (sync only) sits in the
middle of the stack, so the chain goes sync → async (``async_to_sync``) → sync again for the view. Profiled under load
(``bench/api_profile.py``, bench/README.md "api_load.py"), those hops were most of the difference between a view's
CPU in-process and over HTTP.

Every middleware in ``settings.MIDDLEWARE`` and every HTTP view is synchronous, so here the chain is loaded in sync
mode (as under WSGI) and the whole of it — ``request_started``, middleware, view, exception handling, response
logging and ``request_finished`` — runs in one ``sync_to_async`` call on the request's thread-sensitive thread
(:meth:`SyncChainASGIHandler.handle`). Streaming responses (the SSE run streams' async
iterators) are still sent by the async handler afterwards, as before; an async one once the request's thread is given
back, so an open stream holds no thread (issue #49: one key's 195 open streams held 195). An async view or middleware would still
work (Django adapts it with ``async_to_sync``), only slower: keep HTTP views and middleware synchronous (websockets go
through Channels).

**One thread per request, not a new one.** Django enters a ``ThreadSensitiveContext`` per request so that the
``request_started`` receivers, the chain and ``response.close()`` (``request_finished``: the pooled database
connection goes back) run on one thread. asgiref makes that thread anew for every request — a ``ThreadPoolExecutor``
and its thread, a second thread to join it at the end, and on the new thread a new ``DatabaseWrapper`` per
database alias (Django's connections are per thread) — which under load was about a tenth of a server's CPU. Here
each request borrows a single-thread executor from :class:`Threads` for its context (asgiref's
``ThreadSensitiveContext(executor=...)``: same rules, one call at a time on one thread) and gives it back when the
request is done, so the threads and their connection objects live as long as the process. The same request still
runs on one thread; two requests never share one at the same time.

**A few at a time.** Past ``REQUEST_THREADS`` requests running Django in a process, the next waits its turn in the
event loop (an ``asyncio.Semaphore``, first come first served), holding no thread. A process runs Python on one core at
a time: under load, 48 threads taking turns on the GIL each finish later than if they had run a few at a time, and
switching between them costs CPU of its own (``bench/api_load.py``: at 220 requests/s on 2 cores, 2 at a time answered
more requests, with less CPU each, and refused a sixth to two thirds as many). A request still running after ``REQUEST_TURN_SECONDS``
(most often one waiting on something slow: a pool connection, an MCP server being imported) stops counting and lets
the next one start, so slow requests cannot hold the process's turns; ``MAX_CONCURRENT_REQUESTS``
(config/admission.py) still bounds everything in progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.db import close_old_connections
from django.http import FileResponse
from django.urls import set_script_prefix

#: Idle threads a server process keeps for the next requests; past it, a thread given back is let go.
#: ``MAX_CONCURRENT_REQUESTS`` bounds the requests in progress (config/admission.py); an event stream gives its
#: request's thread back once its response is ready (``SyncChainASGIHandler.__call__``).
KEEP_IDLE = 64

T = TypeVar("T")


class Threads:
    """Single-thread executors lent to requests, one at a time each: ``borrow()`` a free one (or a new one),
    ``give_back()`` when the request is over. Used only from the server's event loop thread; the lock makes it safe
    from anywhere else too."""

    def __init__(self, keep_idle: int = KEEP_IDLE) -> None:
        self.keep_idle = keep_idle
        self._idle: list[ThreadPoolExecutor] = []
        self._lock = threading.Lock()
        self.made = 0

    def borrow(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.made += 1
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        with self._lock:
            if len(self._idle) < self.keep_idle:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)  # its thread ends once what it runs (if anything) returns


class Turns:
    """At most ``size`` calls running at once, the others waiting in order; a call running past ``turn`` seconds stops
    counting (it goes on; the next one starts). ``size`` 0: no bound. Used from one event loop (the server's)."""

    def __init__(self, size: int, turn: float) -> None:
        self.size, self.turn = size, turn
        # made inside the event loop that uses them (a server process has one; each asyncio.run in a test its own)
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    async def run(self, call: Coroutine[Any, Any, T]) -> T:
        if not self.size:
            return await call
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.size))
        slots = self._slots[1]
        try:
            await slots.acquire()
        except BaseException:
            call.close()  # never started: no "coroutine was never awaited" warning
            raise
        held = True
        task = asyncio.ensure_future(call)
        try:
            try:
                return await asyncio.wait_for(asyncio.shield(task), self.turn)
            except TimeoutError:
                held = False
                slots.release()  # still running (its thread cannot be stopped): the next request's turn
                return await task
        finally:
            if held:
                slots.release()


class SyncChainASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self.threads = Threads()
        self.turns = Turns(settings.REQUEST_THREADS, settings.REQUEST_TURN_SECONDS)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self.threads.borrow()
        try:
            # Django's handle(): request_started, the chain, response.close() — all on the borrowed thread.
            async with ThreadSensitiveContext(executor=executor):
                stream = await self.handle(scope, receive, send)
        finally:
            # A view still running after a client went away only delays the next request given this executor: it
            # runs one call at a time, in order.
            self.threads.give_back(executor)
        if stream is not None:
            # An async stream (a run's SSE) is sent once the request's thread is given back: open for as long as its
            # run lasts, it holds no thread; its short reads go where a websocket's do (the process's sync thread).
            try:
                await self._stream(stream, receive, send)
            finally:
                await sync_to_async(stream.close, thread_sensitive=True)()

    async def handle(self, scope: Any, receive: Any, send: Any) -> Any:
        """Django's ``ASGIHandler.handle`` in one hop to the request's thread instead of three.

        Django sends ``request_started`` (a hop), runs the chain (a hop) while a second task listens for the client
        going away, sends the response and calls ``response.close()`` (``request_finished``: a third hop). Here
        ``request_started``, the request, the chain and — for an ordinary response, whose content is in memory —
        ``close()`` run in one call on the request's thread (:meth:`respond`); the response is then sent. Only a
        streaming response (an SSE run stream) is sent while a second task listens for the client going away, and
        closed afterwards, as Django does: a stream may last as long as its run. Listening while a synchronous view
        runs bought nothing: a thread cannot be cancelled, and a response sent to a client that left is dropped by
        the server.

        An async streaming response is not sent here but returned, for :meth:`__call__` to send after giving the
        request's thread back (the view's database connection went back already, see :meth:`respond`).
        """
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return None
        try:
            set_script_prefix(get_script_prefix(scope))
            response = await self.turns.run(sync_to_async(self.respond, thread_sensitive=True)(scope, body_file))
            if response.streaming and response.is_async:
                return response
            if response.streaming:
                await self._stream(response, receive, send)
                await sync_to_async(response.close, thread_sensitive=True)()
            else:
                await self.send_response(response, send)
        finally:
            body_file.close()
        return None

    def respond(self, scope: Any, body_file: Any) -> Any:
        """``request_started``, the request, the chain and (unless it streams) ``response.close()``, on one thread."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            # BaseHandler.get_response: set the urlconf, run the chain, attach request.close, log 4xx/5xx.
            response = self.get_response(request)
            response._handler_class = self.__class__
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size
        if not response.streaming:
            response.close()  # request_finished: the pooled connection goes back, from the thread that used it
        elif response.is_async:
            close_old_connections()  # sent from no thread of its own (__call__): the pooled connection goes back now
        return response

    async def _stream(self, response: Any, receive: Any, send: Any) -> None:
        """Send a streaming response while listening for the client going away (Django's two tasks)."""

        async def send_all() -> None:
            with contextlib.suppress(asyncio.CancelledError):  # the client went away while it was sent
                await self.send_response(response, send)

        tasks = [asyncio.create_task(self.listen_for_disconnect(receive)), asyncio.create_task(send_all())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                with contextlib.suppress(RequestAborted):
                    task.result()
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def get_asgi_application() -> SyncChainASGIHandler:
    """``django.core.asgi.get_asgi_application`` with the synchronous middleware chain."""
    import django

    django.setup(set_prefix=False)
    return SyncChainASGIHandler()

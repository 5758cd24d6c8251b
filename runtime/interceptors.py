"""Interceptors wrap one model call or one tool call.

An interceptor gets the request (a private copy) and ``call_next``; it may change the request
before passing it on and the response after. It never sees the run's state, and it cannot steer
the loop: a stop decided by a guard inside the chain holds even if an interceptor swallows it.
To leave a note in the trace, append a ``{"type": ...}`` dict to ``response.trace`` /
``outcome.trace``; the loop turns it into an event.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from runtime.types import ModelRequest, ModelResponse, ToolCall, ToolContext, ToolOutcome

ModelCall = Callable[[ModelRequest], ModelResponse]
ToolCallFn = Callable[[ToolCall, ToolContext], ToolOutcome]


class ModelInterceptor(Protocol):
    def __call__(self, request: ModelRequest, call_next: ModelCall) -> ModelResponse: ...


class ToolInterceptor(Protocol):
    def __call__(self, call: ToolCall, ctx: ToolContext, call_next: ToolCallFn) -> ToolOutcome: ...


def chain_model(interceptors: Sequence[ModelInterceptor], inner: ModelCall) -> ModelCall:
    """The first interceptor is the outermost. The request handed in is copied once (``private_copy``)."""
    call: ModelCall = inner
    for interceptor in reversed(interceptors):
        call = _bind_model(interceptor, call)

    def start(request: ModelRequest) -> ModelResponse:
        return call(request.private_copy())

    return start


def _bind_model(interceptor: ModelInterceptor, call_next: ModelCall) -> ModelCall:
    def wrapped(request: ModelRequest) -> ModelResponse:
        return interceptor(request, call_next)

    return wrapped


def chain_tool(interceptors: Sequence[ToolInterceptor], inner: ToolCallFn) -> ToolCallFn:
    call: ToolCallFn = inner
    for interceptor in reversed(interceptors):
        call = _bind_tool(interceptor, call)
    return call


def _bind_tool(interceptor: ToolInterceptor, call_next: ToolCallFn) -> ToolCallFn:
    def wrapped(call: ToolCall, ctx: ToolContext) -> ToolOutcome:
        return interceptor(call, ctx, call_next)

    return wrapped


def request_transform(transform: Callable[[ModelRequest], ModelRequest]) -> ModelInterceptor:
    """Adapt a plain ``request -> request`` function into an interceptor."""

    def interceptor(request: ModelRequest, call_next: ModelCall) -> ModelResponse:
        return call_next(transform(request))

    return interceptor

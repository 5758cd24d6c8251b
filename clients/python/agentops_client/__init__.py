"""A typed client for the Agent Operations Console API (``/api/v1``). Depends only on httpx."""

from agentops_client.client import Client, RunStream
from agentops_client.errors import (
    AgentOpsError,
    ApiError,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    RateLimited,
    StreamInterrupted,
    Unauthorized,
    Unavailable,
)
from agentops_client.models import Approval, Decision, Page, RetryNotice, Run, Session, StreamEvent

__all__ = [
    "AgentOpsError", "ApiError", "Approval", "Client", "Conflict", "Decision", "Forbidden", "InvalidRequest", "NotFound",
    "Page", "RateLimited", "RetryNotice", "Run", "RunStream", "Session", "StreamEvent", "StreamInterrupted", "Unauthorized",
    "Unavailable",
]

"""Per-tool rate limits: calls per minute per tenant per tool (``Tool.rate_limit_per_minute``; empty = no limit).

The tool gateway's ``rate_limit`` stage takes one request from a token bucket keyed (tenant, tool), in the
model gateway's bucket machinery (:mod:`llm.ratelimit`): the Redis Lua bucket when ``REDIS_URL`` is
set, so every worker process shares the budget, in process memory otherwise. A bucket holds a minute's
worth (a quiet minute allows a burst of N) and refills N per minute.

A plugin's declared limit is a floor for the tenant: they may lower it, never raise or remove it. A
tenant's own tool has whatever limit its operators set. Pure: no Django here.
"""

from __future__ import annotations

from typing import Any

from llm.config import RateLimit
from llm.ratelimit import Bucket, buckets_for

#: The largest limit one can set (a bigger one is no limit in practice; leave the field empty instead).
MAX_PER_MINUTE = 100_000
FIELD = "rate_limit_per_minute"
RANGE_MESSAGE = f"Must be a whole number of calls per minute from 1 to {MAX_PER_MINUTE}, or empty for no limit."


def value_problem(value: Any) -> str:
    """Why ``value`` is not a rate limit (empty when it is one, or None: no limit)."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PER_MINUTE:
        return f"{RANGE_MESSAGE[:-1]}; got {value!r}."
    return ""


def floor_problem(*, tool_name: str, plugin: str, declared: int | None, value: int | None) -> str:
    """Why a tenant may not set ``value`` on a plugin's tool whose plugin declares ``declared`` (empty: it may)."""
    if declared is None or (value is not None and value <= declared):
        return ""
    wanted = "remove it" if value is None else f"raise it to {value}"
    return (f"The plugin {plugin!r} limits {tool_name} to {declared} calls per minute; you can lower that limit "
            f"(1 to {declared}) but not {wanted}.")


def buckets(tenant_id: Any, tool_name: str, per_minute: int) -> list[Bucket]:
    """The one request bucket of a (tenant, tool): key ``tool:<tenant id>:<tool name>:requests``."""
    return buckets_for("tool", f"{tenant_id}:{tool_name}", RateLimit(requests_per_minute=per_minute), 0,
                       f"tool {tool_name!r} of tenant {tenant_id}")


def model_message(tool_name: str, per_minute: int, retry_in: int) -> str:
    calls = "call" if per_minute == 1 else "calls"
    return (f"Tool {tool_name} is limited to {per_minute} {calls} per minute for this tenant; try again in ~{retry_in} "
            f"seconds or continue without it.")

"""Brute-force limits on the login pages (``/admin/login/``, ``/accounts/login/``), by django-axes.

Policy (settings ``AXES_*``): a username is locked out *from one address* after ``AXES_FAILURE_LIMIT`` failed
logins, for ``AXES_COOLOFF_MINUTES``; the right password is refused meanwhile (429 and the lockout page). The
address alone never locks, so one person's typos, or an attacker, cannot lock out everyone behind the same
NAT, and a username alone never locks, so nobody can lock a colleague out from elsewhere. A successful login
resets the count. The client address is ``REMOTE_ADDR``, or with ``CLIENT_IP_HEADER`` set (behind a trusted
reverse proxy only) the right-most address in that header, the one the proxy itself appended.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_cool_off, get_failure_limit
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


class LoginLockoutBackend(AxesStandaloneBackend):
    """Axes' lockout check, first in ``AUTHENTICATION_BACKENDS``, for logins that come with a request.

    A login without a request (the test client's ``login()``, a shell) is no web login: axes would refuse it
    with an error, this lets the next backend decide.
    """

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None,
                     **kwargs: Any) -> None:
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)


def client_ip(request: HttpRequest) -> str | None:
    """``REMOTE_ADDR``, or the right-most valid address of ``CLIENT_IP_HEADER`` when one is configured."""
    header = getattr(settings, "CLIENT_IP_HEADER", None)
    if header:
        candidates = [part.strip() for part in request.META.get(header, "").split(",") if part.strip()]
        if candidates:
            try:
                return str(ipaddress.ip_address(candidates[-1]))
            except ValueError:
                pass
    return request.META.get("REMOTE_ADDR")


def lockout_response(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    """The lockout page: 429 with ``Retry-After`` (the cool-off, which restarts at each attempt made while locked)."""
    cool_off = get_cool_off(request)
    seconds = int(cool_off.total_seconds()) if cool_off else 0
    context = {"failure_limit": get_failure_limit(request, credentials), "cooloff_minutes": max(1, seconds // 60)}
    response = render(request, "registration/locked_out.html", context, status=429)
    if seconds:
        response["Retry-After"] = str(seconds)
    return response

"""Issue 11, hole 6 (logins): guessing passwords on either login page locks that username out from that address.

Policy: after AXES_FAILURE_LIMIT failures a username is locked out from the address they came from, for the
cool-off, even with the right password (429, the lockout page, Retry-After). The address alone never locks:
another username from the same address still logs in, and so does the same username from elsewhere.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import Client, RequestFactory, override_settings

from core.login_lockout import client_ip
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery"  # tests.factories.make_user
PAGES = ["/accounts/login/", "/admin/login/"]
ATTACKER, COLLEAGUE = "203.0.113.7", "198.51.100.20"


@pytest.fixture
def world(settings: Any) -> World:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # dozens of logins, quickly
    return make_world()


def _login(page: str, username: str, password: str, address: str = ATTACKER) -> tuple[Any, bool]:
    """One login attempt from a fresh browser; the response and whether it ended logged in."""
    browser = Client(REMOTE_ADDR=address)
    response = browser.post(page, {"username": username, "password": password, "next": "/console/runs/"})
    return response, "_auth_user_id" in browser.session


@pytest.mark.parametrize("page", PAGES)
def test_forty_wrong_passwords_then_the_right_one_is_locked_out(world: World, page: str) -> None:
    # given 40 wrong passwords for one username from one address
    user = world.operator.username
    for n in range(40):
        response, logged_in = _login(page, user, f"guess-{n}")
        assert not logged_in
    # when the right password comes from the same address
    response, logged_in = _login(page, user, PASSWORD)
    # then it is refused with the lockout page
    assert not logged_in
    assert response.status_code == 429
    assert int(response["Retry-After"]) == int(django_settings.AXES_COOLOFF_TIME.total_seconds())
    assert "Too many failed logins" in response.content.decode()


@pytest.mark.parametrize("page", PAGES)
def test_the_lock_starts_at_the_failure_limit(world: World, page: str) -> None:
    user = world.operator.username
    for n in range(django_settings.AXES_FAILURE_LIMIT - 1):
        assert _login(page, user, f"guess-{n}")[0].status_code == 200
    assert _login(page, user, "one-more-guess")[0].status_code == 429


def test_the_address_alone_does_not_lock_nor_the_username_alone(world: World) -> None:
    # given the operator's username locked out from the attacker's address
    for n in range(django_settings.AXES_FAILURE_LIMIT):
        _login("/accounts/login/", world.operator.username, f"guess-{n}")
    assert _login("/accounts/login/", world.operator.username, PASSWORD)[0].status_code == 429
    # then another username still logs in from that address, and the operator from their own
    assert _login("/accounts/login/", world.viewer.username, PASSWORD)[1]
    assert _login("/admin/login/", world.operator.username, PASSWORD, address=COLLEAGUE)[1]


def test_a_successful_login_resets_the_count(world: World) -> None:
    user = world.operator.username
    for _round in range(3):
        for n in range(django_settings.AXES_FAILURE_LIMIT - 1):
            _login("/accounts/login/", user, f"typo-{n}")
        assert _login("/accounts/login/", user, PASSWORD)[1]


def test_logins_without_a_request_still_work(world: World) -> None:
    assert Client().login(username=world.operator.username, password=PASSWORD)


@override_settings(CLIENT_IP_HEADER="HTTP_X_FORWARDED_FOR")
def test_behind_a_trusted_proxy_the_address_is_the_one_it_appended() -> None:
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="1.2.3.4, 203.0.113.7")
    assert client_ip(request) == "203.0.113.7"  # the client can forge the left part, not what the proxy appended
    assert client_ip(RequestFactory().get("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="garbage")) == "10.0.0.2"


def test_without_a_proxy_header_the_forwarded_header_is_ignored() -> None:
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.1", HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert client_ip(request) == "192.0.2.1"

"""Swagger UI in Chromium: "Authorize" takes a tenant's API key, and "Try it out" then calls the API with it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import World, make_world

pytestmark = [pytest.mark.integration, pytest.mark.browser]


@pytest.fixture(scope="module")
def world(live_stack: Any, django_db_blocker: Any) -> World:
    with django_db_blocker.unblock():
        return make_world()


def test_authorize_with_an_api_key_then_try_the_run_list(page: Any, live_stack: Any, world: World) -> None:
    page.goto(f"{live_stack.base_url}/api/docs/")
    page.click("button.authorize")
    dialog = page.locator(".auth-container").filter(has_text="http, Bearer")
    assert "apiKey" in dialog.inner_text()
    dialog.locator("input").first.fill(world.raw_key)
    dialog.locator("button.authorize").click()
    dialog.locator("h6", has_text="Authorized").wait_for()  # the key is taken
    dialog.locator("button.btn-done").click()

    operation = page.locator(".opblock-get").filter(has=page.locator("[data-path='/api/v1/runs']")).first
    operation.locator(".opblock-summary").click()
    operation.locator("button.try-out__btn").click()
    operation.locator("button.execute").click()
    status = operation.locator(".live-responses-table .response .response-col_status").first
    status.wait_for()
    assert status.inner_text().strip().startswith("200"), operation.locator(".live-responses-table").inner_text()
    assert "Authorization: Bearer" in operation.locator(".curl-command").inner_text()
    assert page.js_errors == []

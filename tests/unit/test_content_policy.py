"""Issue #14: config/content_policy.py builds the Content-Security-Policy once, and sets on every response exactly the
headers django-csp's own middleware sets: compared response by response, with nonces, a view's own policy, exemptions,
excluded prefixes, a report-only policy, the debug pages and a changed setting."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import csp.middleware
import pytest
from csp.constants import HEADER, HEADER_REPORT_ONLY, NONCE, SELF
from django.http import HttpResponse
from django.test import RequestFactory, override_settings

from config import content_policy
from config.content_policy import CSPMiddleware

REPORT_ONLY = {"EXCLUDE_URL_PREFIXES": ["/docs"], "DIRECTIVES": {"default-src": [SELF], "script-src": [SELF, NONCE],
                                                                  "report-uri": "/csp-report"}}


def response_with(**attributes: Any) -> Callable[[Any], HttpResponse]:
    def view(request: Any) -> HttpResponse:
        response = HttpResponse("ok", status=attributes.pop("status", 200))
        for name, value in attributes.items():
            setattr(response, name, value)
        return response
    return view


CASES: dict[str, tuple[str, Callable[[Any], HttpResponse], bool]] = {
    # name: (path, view, whether the view reads request.csp_nonce)
    "plain": ("/api/v1/runs", response_with(), False),
    "nonce used": ("/api/docs", response_with(), True),
    "view updates": ("/x", response_with(_csp_update={"img-src": ["https://img.example"]}), False),
    "view replaces": ("/x", response_with(_csp_replace={"script-src": [SELF]}), False),
    "view's own config": ("/x", response_with(_csp_config={"default-src": [SELF]}), False),
    "report-only update": ("/x", response_with(_csp_update_ro={"img-src": ["data:"]}), False),
    "exempt": ("/x", response_with(_csp_exempt=True), False),
    "exempt from report-only": ("/x", response_with(_csp_exempt_ro=True), False),
    "header already set": ("/x", response_with(), False),
    "not found": ("/x", response_with(status=404), False),
    "server error": ("/x", response_with(status=500), False),
    "excluded prefix": ("/docs/page", response_with(), False),
}


def headers(middleware_class: type, path: str, view: Callable[[Any], HttpResponse], reads_nonce: bool,
            name: str) -> dict[str, str]:
    request = RequestFactory().get(path)

    def chain(request: Any) -> HttpResponse:
        if reads_nonce:
            str(request.csp_nonce)
        response = view(request)
        if name == "header already set":
            response[HEADER] = "default-src 'none'"
        return response

    response = middleware_class(chain)(request)
    found = {h: response[h] for h in (HEADER, HEADER_REPORT_ONLY) if h in response}
    nonce = getattr(request, "_csp_nonce", None)
    if nonce is None:  # the nonce is locked once the header is written without one
        with pytest.raises(csp.middleware.CSPNonceError):
            str(request.csp_nonce)
    return {h: v.replace(nonce, "NONCE") if nonce else v for h, v in found.items()}


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("report_only", [None, REPORT_ONLY])
@pytest.mark.parametrize("name", list(CASES))
def test_every_response_gets_the_headers_django_csp_gives_it(name: str, report_only: Any, debug: bool) -> None:
    path, view, reads_nonce = CASES[name]
    with override_settings(DEBUG=debug, CONTENT_SECURITY_POLICY_REPORT_ONLY=report_only):
        ours = headers(CSPMiddleware, path, view, reads_nonce, name)
        theirs = headers(csp.middleware.CSPMiddleware, path, view, reads_nonce, name)
    assert ours == theirs
    if name == "plain":
        assert "script-src 'self'" in ours[HEADER] and "nonce-" not in ours[HEADER]
        assert (HEADER_REPORT_ONLY in ours) == (report_only is not None)


def test_the_policy_is_built_once_and_again_when_its_setting_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[bool] = []
    real = content_policy.build_policy

    def counted(**kwargs: Any) -> str:
        built.append(kwargs.get("report_only", False))
        return real(**kwargs)

    monkeypatch.setattr(content_policy, "build_policy", counted)
    content_policy._policies.clear()
    path, view, _ = CASES["plain"]
    first = [headers(CSPMiddleware, path, view, False, "plain") for _ in range(3)]
    assert first[0] == first[1] == first[2] and built == [False, True]
    with override_settings(CONTENT_SECURITY_POLICY={"DIRECTIVES": {"default-src": ["'none'"]}}):
        assert headers(CSPMiddleware, path, view, False, "plain")[HEADER] == "default-src 'none'"
    assert headers(CSPMiddleware, path, view, False, "plain") == first[0]

"""django-csp's middleware, with the policy built once instead of once per response (issue #14).

django-csp builds the ``Content-Security-Policy`` header from the settings on every response: it copies the policy's
parts (``dataclasses.asdict``) and walks every directive, twice (the policy and the report-only one). A response whose
request never asked for a nonce and whose view changed nothing of the policy (``csp_update``, ``csp_replace``,
``csp_override``) gets exactly ``build_policy()`` — the settings' policy, without a nonce — so here that string is built
once per settings and reused; under load the per-response build was ≈ 1.5 % of a server's CPU. Everything else (a page
that used ``request.csp_nonce``, a view's own policy, the debug pages) goes through django-csp as before. The rules
for setting the header (not already set, not exempted, not under an excluded prefix) and the lock on the nonce after
the header is written are django-csp 4.0's (``csp.middleware.CSPMiddleware.process_response``), unchanged;
``tests/unit/test_content_policy.py`` compares the two middlewares' headers response by response.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import csp.middleware
from csp.constants import HEADER, HEADER_REPORT_ONLY
from csp.middleware import CheckableLazyObject
from csp.utils import build_policy
from django.conf import settings
from django.core.signals import setting_changed

#: What a view sets on its response to change the policy (django-csp's decorators); any of them: django-csp builds it.
_PER_RESPONSE = ("_csp_config", "_csp_update", "_csp_replace", "_csp_config_ro", "_csp_update_ro", "_csp_replace_ro")
#: (header, the response attribute exempting it, the settings holding its policy), as django-csp sets them.
_HEADERS = ((HEADER, "_csp_exempt", "CONTENT_SECURITY_POLICY"),
            (HEADER_REPORT_ONLY, "_csp_exempt_ro", "CONTENT_SECURITY_POLICY_REPORT_ONLY"))

_policies: dict[str, tuple[str, tuple[str, ...]]] = {}


def _forget(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("CONTENT_SECURITY_POLICY"):
        _policies.clear()


setting_changed.connect(_forget)


def _policy(setting: str) -> tuple[str, tuple[str, ...]]:
    """The settings' policy without a nonce (``""``: none), and the path prefixes it is not sent under."""
    found = _policies.get(setting)
    if found is None:
        config = getattr(settings, setting, None) or {}
        text = build_policy(report_only=setting.endswith("_REPORT_ONLY"))
        found = _policies[setting] = (text, tuple(config.get("EXCLUDE_URL_PREFIXES", None) or ()))
    return found


class CSPMiddleware(csp.middleware.CSPMiddleware):
    def process_response(self, request: Any, response: Any) -> Any:
        if (getattr(request, "_csp_nonce", None) is not None
                or any(getattr(response, name, None) is not None for name in _PER_RESPONSE)
                or (settings.DEBUG and response.status_code in (HTTPStatus.INTERNAL_SERVER_ERROR, HTTPStatus.NOT_FOUND))):
            return super().process_response(request, response)
        for header, exempt, setting in _HEADERS:
            text, excluded = _policy(setting)
            if (text and header not in response and getattr(response, exempt, False) is False
                    and not request.path_info.startswith(excluded)):
                response[header] = text
        # as django-csp: reading request.csp_nonce now would add a nonce the header no longer carries
        request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)
        return response

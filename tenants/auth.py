"""API key authentication, shared by DRF and the websocket middleware."""

from __future__ import annotations

import hmac
from typing import Any

from rest_framework import authentication, exceptions

from tenants.models import ApiKey, hash_key


def find_api_key(raw: str) -> ApiKey | None:
    """The active key matching ``raw``, or None. Constant-time comparison of hashes."""
    prefix = ApiKey.prefix_of(raw.strip())
    if prefix is None:
        return None
    key = (
        ApiKey.objects.select_related("tenant", "created_by")
        .filter(prefix=prefix, revoked_at__isnull=True, tenant__is_active=True, created_by__is_active=True)
        .first()
    )
    if key is None or not hmac.compare_digest(key.hashed, hash_key(raw.strip())):
        return None
    key.touch()
    return key


def bearer_token(header_value: str | bytes | None) -> str | None:
    if not header_value:
        return None
    if isinstance(header_value, bytes):
        header_value = header_value.decode("latin-1")
    scheme, _, token = header_value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer aok_…``. ``request.auth`` is the ApiKey; ``request.user`` its owner."""

    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, ApiKey] | None:
        header = authentication.get_authorization_header(request)
        if not header:
            return None
        token = bearer_token(header)
        if token is None:
            return None
        key = find_api_key(token)
        if key is None:
            raise exceptions.AuthenticationFailed(
                "The API key is not valid: it is unknown, revoked, or malformed. Expected `Authorization: Bearer aok_…`."
            )
        return key.created_by, key

    def authenticate_header(self, request: Any) -> str:
        return self.keyword

"""API key authentication, shared by DRF and the websocket middleware."""

from __future__ import annotations

import hmac
from typing import Any

from django.db.models import OuterRef, Subquery
from rest_framework import authentication, exceptions

from tenants import keycache
from tenants.models import ApiKey, Membership, hash_key
from tenants.scoping import effective_key_role

OWNER_GONE = (
    "This API key's owner no longer has access to tenant {tenant!r} (their membership was removed or their "
    "account deactivated), so the key no longer works. Ask an owner of the tenant for a new key."
)


def find_api_key(raw: str) -> ApiKey | None:
    """The unrevoked key of an active tenant matching ``raw``, or None.

    From this process's key cache (``tenants/keycache.py``: no query) while nothing that decides a key's access changed
    anywhere since it was read, else from the database (:func:`load_api_key`). The key comes with its tenant, its owner
    and the owner's current role in the key's tenant (``owner_role``, used by ``tenants.scoping.effective_key_role``);
    it is returned even when its owner lost access: callers refuse it through the effective role.
    """
    raw = raw.strip()
    if ApiKey.prefix_of(raw) is None:
        return None
    stamp = keycache.current_stamp() if keycache.enabled() else None
    if stamp is None:
        return load_api_key(raw)
    hashed = hash_key(raw)
    key = keycache.get(hashed, stamp)
    if key is None:
        key = load_api_key(raw)
        if key is not None:
            keycache.put(hashed, stamp, key)
    return key


def load_api_key(raw: str) -> ApiKey | None:
    """:func:`find_api_key` from the database. One query, no sort: the key, its tenant and owner (a join), and the
    owner's role (a subquery). Constant-time comparison of hashes. Records use (``touch``: at most once a minute)."""
    prefix = ApiKey.prefix_of(raw.strip())
    if prefix is None:
        return None
    membership = Membership.objects.filter(tenant_id=OuterRef("tenant_id"), user_id=OuterRef("created_by_id")).order_by()
    try:
        key = (
            ApiKey.objects.select_related("tenant", "created_by")
            .annotate(owner_role=Subquery(membership.values("role")[:1]))
            .get(prefix=prefix, revoked_at__isnull=True, tenant__is_active=True)
        )
    except ApiKey.DoesNotExist:
        return None
    if not hmac.compare_digest(key.hashed, hash_key(raw.strip())):
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
        if effective_key_role(key) is None:
            raise exceptions.AuthenticationFailed(OWNER_GONE.format(tenant=key.tenant.slug))
        return key.created_by, key

    def authenticate_header(self, request: Any) -> str:
        return self.keyword

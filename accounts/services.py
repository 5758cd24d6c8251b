"""Tenant state changes: explicit acting user, one transaction, an audit row in it."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from audit.services import record_change
from tenants.models import ApiKey, Membership, Role, Tenant, hash_key


@transaction.atomic
def create_api_key(*, tenant: Tenant, name: str, owner: Any, role: str = Role.OPERATOR, actor: Any = None,
                   raw: str | None = None) -> tuple[ApiKey, str]:
    """Create a key and return it with the raw value, which is never stored and shown only now."""
    if raw is None:
        raw, prefix = ApiKey.generate()
    else:
        prefix = ApiKey.prefix_of(raw)
        if prefix is None:
            raise ValueError("A given API key must look like aok_<8 hex chars>_<secret>.")
    key = ApiKey.objects.create(tenant=tenant, name=name, prefix=prefix, hashed=hash_key(raw), role=role, created_by=owner)
    record_change(tenant=tenant, actor=actor or owner, action="api_key.created", target=key, details={"prefix": prefix, "role": role})
    return key, raw


@transaction.atomic
def revoke_api_key(*, key: ApiKey, actor: Any) -> ApiKey:
    from django.utils import timezone

    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        record_change(tenant=key.tenant, actor=actor, action="api_key.revoked", target=key, details={"prefix": key.prefix})
    return key


@transaction.atomic
def set_membership(*, tenant: Tenant, user: Any, role: str, actor: Any) -> Membership:
    membership, created = Membership.objects.update_or_create(tenant=tenant, user=user, defaults={"role": role})
    record_change(tenant=tenant, actor=actor, action="membership.created" if created else "membership.changed",
                  target=membership, details={"user": user.get_username(), "role": role})
    return membership

"""Tenants, members and API keys: every change checks the actor's role, runs in one transaction, writes its audit row.

The admin, the API and management commands call these alike. ``actor`` is an :class:`~tenants.scoping.Actor`
(``None``: the platform itself, e.g. the demo seed). Members and keys are managed by the tenant's owners; a tenant's
slug, activity and settings (what the platform grants it) by superusers only.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import record_change
from core.errors import Conflict, Forbidden, Invalid, only_fields
from tenants.models import MAX_RUNNING_LIMIT, ApiKey, Membership, Role, Tenant, hash_key
from tenants.scoping import Actor, acting

#: What a tenant's owner may change on the tenant; the rest is the platform's (superusers).
TENANT_OWNER_FIELDS = ("name",)
TENANT_FIELDS = ("name", "slug", "is_active", "settings", "max_running")


@transaction.atomic
def create_api_key(*, tenant: Tenant, name: str, owner: Any, role: str = Role.OPERATOR, actor: Actor | None = None,
                   raw: str | None = None) -> tuple[ApiKey, str]:
    """Create a key and return it with the raw value, which is never stored and shown only now."""
    acting(actor).require("own", tenant.pk)
    _check_role(role)
    if raw is None:
        raw, prefix = ApiKey.generate()
    else:
        prefix = ApiKey.prefix_of(raw)
        if prefix is None:
            raise Invalid("A given API key must look like aok_<8 hex chars>_<secret>.", field="raw")
    key = ApiKey.objects.create(tenant=tenant, name=name, prefix=prefix, hashed=hash_key(raw), role=role, created_by=owner)
    record_change(tenant=tenant, actor=actor, action="api_key.created", target=key, details={"prefix": prefix, "role": role})
    return key, raw


@transaction.atomic
def rename_api_key(*, key: ApiKey, name: str, actor: Actor | None) -> ApiKey:
    """A key's name is the only thing that changes after it was made (its role and tenant are fixed; revoke instead)."""
    acting(actor).require("own", key.tenant_id)
    name = (name or "").strip()
    if not name:
        raise Invalid("A key needs a name that says who or what uses it.", field="name")
    if name != key.name:
        previous, key.name = key.name, name
        key.save(update_fields=["name"])
        record_change(tenant=key.tenant, actor=actor, action="api_key.renamed", target=key,
                      details={"prefix": key.prefix, "previous": previous, "name": name})
    return key


@transaction.atomic
def revoke_api_key(*, key: ApiKey, actor: Actor | None) -> ApiKey:
    acting(actor).require("own", key.tenant_id)
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        record_change(tenant=key.tenant, actor=actor, action="api_key.revoked", target=key, details={"prefix": key.prefix})
    return key


@transaction.atomic
def set_membership(*, tenant: Tenant, user: Any, role: str, actor: Actor | None) -> Membership:
    acting(actor).require("own", tenant.pk)
    _check_role(role)
    current = Membership.objects.select_for_update().filter(tenant=tenant, user=user).first()
    if current is not None and current.role == Role.OWNER and role != Role.OWNER:
        _keep_an_owner(tenant, current)
    membership, created = Membership.objects.update_or_create(tenant=tenant, user=user, defaults={"role": role})
    record_change(tenant=tenant, actor=actor, action="membership.created" if created else "membership.changed",
                  target=membership, details={"user": user.get_username(), "role": role})
    return membership


@transaction.atomic
def remove_membership(*, membership: Membership, actor: Actor | None) -> None:
    acting(actor).require("own", membership.tenant_id)
    # the membership's row, then the tenant's (_keep_an_owner): the order set_membership takes them in
    locked = Membership.objects.select_for_update().filter(pk=membership.pk).first()
    if locked is None:
        return  # removed meanwhile
    membership.role = locked.role
    if membership.role == Role.OWNER:
        _keep_an_owner(membership.tenant, membership)
    details = {"user": membership.user.get_username(), "role": membership.role}
    record_change(tenant=membership.tenant, actor=actor, action="membership.removed", target=membership, details=details)
    membership.delete()


@transaction.atomic
def create_tenant(*, actor: Actor | None, slug: str, name: str, is_active: bool = True,
                  settings: dict[str, Any] | None = None, max_running: int | None = None) -> Tenant:
    """A new tenant: the platform's (superusers) to make."""
    if not acting(actor).is_superuser:
        raise Forbidden("Only a platform administrator may create a tenant.")
    if Tenant.objects.filter(slug=slug).exists():
        raise Invalid(f"A tenant {slug!r} exists already; choose another slug.", field="slug")
    _check_max_running(max_running)
    tenant = Tenant(slug=slug, name=name, is_active=is_active, settings=settings or {}, max_running=max_running)
    tenant.full_clean()
    tenant.save()
    record_change(tenant=tenant, actor=actor, action="tenant.created", target=tenant, details={"slug": slug})
    return tenant


@transaction.atomic
def update_tenant(*, tenant: Tenant, actor: Actor | None, **changes: Any) -> Tenant:
    """Change a tenant: its owners may rename it; its slug, activity and settings are the platform's to set."""
    who = acting(actor)
    who.require("own", tenant.pk)
    only_fields("A tenant's", changes, TENANT_FIELDS)
    changed = {name: value for name, value in changes.items() if getattr(tenant, name) != value}
    platform_only = sorted(set(changed) - set(TENANT_OWNER_FIELDS))
    if platform_only and not who.is_superuser:
        raise Forbidden(f"Only a platform administrator may change a tenant's {', '.join(platform_only)} (what the "
                        "platform grants it); its owners may rename it.", field=platform_only[0])
    if "settings" in changed and not isinstance(changed["settings"], dict):
        raise Invalid("A tenant's settings must be a JSON object.", field="settings")
    if "max_running" in changed:
        _check_max_running(changed["max_running"])
    if not changed:
        return tenant
    for name, value in changed.items():
        setattr(tenant, name, value)
    tenant.full_clean()
    tenant.save(update_fields=list(changed))
    record_change(tenant=tenant, actor=actor, action="tenant.changed", target=tenant, details={"changed": sorted(changed)})
    return tenant


def _check_max_running(value: Any) -> None:
    """The tenant's bound on running work (agents/capacity.py): what the platform grants it, so never left to chance."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RUNNING_LIMIT:
        raise Invalid(f"max_running must be a whole number from 1 to {MAX_RUNNING_LIMIT} (runs and flow nodes of the "
                      f"tenant at once), or empty for the deployment's default; got {value!r}.", field="max_running")


def _check_role(role: str) -> None:
    if role not in Role.values:
        raise Invalid(f"role must be one of {', '.join(Role.values)}; got {role!r}.", field="role")


def _keep_an_owner(tenant: Tenant, leaving: Membership) -> None:
    """Refuse to let the tenant's last owner go. The tenant's row is locked first, so two owners demoting or removing
    each other at the same moment are taken one after the other: each counts the owners after the other committed
    (locking only the leaving membership let both see the other still an owner, and both leave)."""
    # NO KEY UPDATE (audit/chain.py's lock order): as exclusive between two of these, and no wait for the runs'
    # commits, whose new rows' foreign keys to the tenant are checked with a KEY SHARE lock
    Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).values_list("pk", flat=True).first()
    others = Membership.objects.filter(tenant=tenant, role=Role.OWNER).exclude(pk=leaving.pk)
    if not others.exists():
        raise Conflict(f"{leaving.user.get_username()} is the last owner of {tenant.slug}; make someone else an owner "
                       "first, so the tenant keeps someone who manages its members and keys.")

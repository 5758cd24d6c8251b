"""Tenants, who belongs to them in which role, and their API keys."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from tenants.scoping import TenantQuerySet, TenantScopedQuerySet

#: The highest bound on running work a tenant may be given (agents/capacity.py).
MAX_RUNNING_LIMIT = 1000


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    is_active = models.BooleanField(default=True)
    settings = models.JSONField(default=dict, blank=True, help_text="Tenant-wide settings, e.g. the tier table.")
    max_running = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(MAX_RUNNING_LIMIT)],
        help_text="At most this many of the tenant's agent runs and flow nodes run at once; the rest wait their turn "
                  "(empty: the deployment's TENANT_MAX_RUNNING).")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    OPERATOR = "operator", "Operator"
    APPROVER = "approver", "Approver"
    VIEWER = "viewer", "Viewer"


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_user_and_tenant")]
        ordering = ["tenant", "user"]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


KEY_PREFIX = "aok"


def hash_key(raw: str) -> str:
    # Keys carry 256 random bits, so a fast hash is enough; it never leaves the database.
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiKey(models.Model):
    """A tenant API key. Only its hash is stored; the key itself is shown once, at creation."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, help_text="The visible start of the key, to recognise it.")
    hashed = models.CharField(max_length=64, unique=True, editable=False)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.OPERATOR)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys",
                                   help_text="The key's owner; runs started with it count as theirs.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "name"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @staticmethod
    def generate() -> tuple[str, str]:
        """A new raw key and its visible prefix: ``aok_<prefix>_<secret>``."""
        prefix = f"{KEY_PREFIX}_{secrets.token_hex(4)}"
        return f"{prefix}_{secrets.token_urlsafe(32)}", prefix

    @staticmethod
    def prefix_of(raw: str) -> str | None:
        parts = raw.split("_", 2)
        if len(parts) != 3 or parts[0] != KEY_PREFIX or len(parts[1]) != 8:
            return None
        return f"{parts[0]}_{parts[1]}"

    def touch(self) -> None:
        """Record use, at most once a minute per key (no write per request)."""
        now = timezone.now()
        if self.last_used_at is None or (now - self.last_used_at).total_seconds() > 60:
            ApiKey.objects.filter(pk=self.pk).update(last_used_at=now)
            self.last_used_at = now

"""A tenant's owner cannot widen what the platform grants the tenant (tenant.settings) through the admin."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from accounts import services as tenant_services
from tenants.models import Role, Tenant
from tests.factories import make_user, make_world

pytestmark = pytest.mark.django_db


def test_the_owner_can_rename_the_tenant_but_not_grant_it_secrets_scopes_or_limits() -> None:
    world = make_world()
    owner = make_user(is_staff=True)
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    Tenant.objects.filter(pk=world.tenant.pk).update(settings={"rate_limit": {"requests_per_minute": 60}})
    client = Client()
    client.force_login(owner)
    url = reverse("admin:tenants_tenant_change", args=[world.tenant.pk])
    page = client.get(url)
    assert page.status_code == 200
    assert 'name="settings"' not in page.content.decode()
    widened = {"provider_secrets": ["DATABASE_URL"], "tool_secrets": ["ADMIN"], "default_scopes": ["orders:refund"],
               "rate_limit": {"requests_per_minute": 100000}}
    response = client.post(url, {
        "name": "Renamed", "slug": "hijacked", "is_active": "on", "settings": json.dumps(widened),
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000",
    })
    assert response.status_code == 302, response.content[:1500]
    tenant = Tenant.objects.get(pk=world.tenant.pk)
    assert tenant.name == "Renamed" and tenant.slug == world.tenant.slug
    assert tenant.settings == {"rate_limit": {"requests_per_minute": 60}}

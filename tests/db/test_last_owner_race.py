"""A tenant keeps an owner when two owners step down at the same moment (accounts/services.py ``_keep_an_owner``):
membership changes that may remove an owner are taken one after the other on the tenant's row, so the second one
counts the owners after the first committed. (Removing a membership locked nothing: it could count a concurrently
demoted owner as still one, and the tenant was left without an owner.)"""

from __future__ import annotations

import pytest
from django.db import connection

from accounts import services
from core.errors import Conflict
from tenants.models import Membership, Role
from tests.factories import make_user, make_world
from tests.support.concurrency import other_transaction, waits_for

ON_POSTGRES = connection.vendor == "postgresql"


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not ON_POSTGRES, reason="row locks and concurrent transactions: PostgreSQL (CI runs this file there)")
def test_an_owner_removed_while_another_steps_down_leaves_the_tenant_an_owner() -> None:
    world = make_world()
    first, second = make_user("owner-one"), make_user("owner-two")
    for user in (first, second):
        services.set_membership(tenant=world.tenant, user=user, role=Role.OWNER, actor=None)
    Membership.objects.filter(tenant=world.tenant, role=Role.OWNER).exclude(user__in=[first, second]).update(role=Role.OPERATOR)
    leaving = Membership.objects.get(tenant=world.tenant, user=first)
    with other_transaction() as other:
        # the second owner steps down in another transaction, as set_membership does it: the tenant's row locked, the
        # owners counted (the first is still one), the membership demoted; not committed yet
        other.execute('SELECT 1 FROM "tenants_tenant" WHERE id = %s FOR UPDATE', [world.tenant.pk])
        other.execute('UPDATE "tenants_membership" SET role = %s WHERE tenant_id = %s AND user_id = %s',
                      [Role.OPERATOR, world.tenant.pk, second.pk])

        def remove_first() -> object:
            try:
                services.remove_membership(membership=leaving, actor=None)
            except Conflict as exc:
                return exc
            return "removed"

        outcome = waits_for(remove_first, other.commit, what="the tenant's row")
    assert isinstance(outcome, Conflict) and "last owner" in str(outcome), outcome
    assert list(Membership.objects.filter(tenant=world.tenant, role=Role.OWNER).values_list("user", flat=True)) == [first.pk]

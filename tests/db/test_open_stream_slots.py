"""Open-stream slots (tenants/open_streams.py): per caller and per tenant, all or nothing, given back on release, and
a lease that lapses when nobody renews it (a killed server process's streams stop counting). In Redis with
``REDIS_URL`` (shared by every server process), in process memory otherwise; the same rules either way."""

from __future__ import annotations

import random
import time
import uuid

import pytest
from django.test import override_settings

from tenants import open_streams


def _tenant() -> int:
    return random.randrange(10**9, 10**10)  # never one an earlier run left in Redis


def _caller() -> str:
    return f"key:{uuid.uuid4().hex[:12]}"


@override_settings(MAX_OPEN_STREAMS_PER_KEY=2, MAX_OPEN_STREAMS_PER_TENANT=3)
def test_a_callers_and_a_tenants_bounds_hold_and_a_released_slot_is_free_again() -> None:
    tenant, first, second = _tenant(), _caller(), _caller()
    held = [open_streams.hold(first, tenant), open_streams.hold(first, tenant)]
    with pytest.raises(open_streams.TooManyStreams) as refused:
        open_streams.hold(first, tenant)
    assert refused.value.scope == "key" and "this API key: 2 streams are open" in refused.value.message
    assert len(refused.value.reason.encode()) <= 123  # fits a websocket close frame
    # the tenant's bound counts every caller: the second caller gets one slot, not two
    held.append(open_streams.hold(second, tenant))
    with pytest.raises(open_streams.TooManyStreams) as refused:
        open_streams.hold(second, tenant)
    assert refused.value.scope == "tenant" and "this tenant: 3 streams are open" in refused.value.message
    # a refusal took nothing: another tenant is not affected, and a release frees exactly one slot
    open_streams.hold(_caller(), _tenant()).release()
    held[0].release()
    held[0].release()  # twice: still one slot
    held.append(open_streams.hold(first, tenant))
    with pytest.raises(open_streams.TooManyStreams):
        open_streams.hold(second, tenant)
    for slot in held:
        slot.release()


@override_settings(MAX_OPEN_STREAMS_PER_KEY=1, MAX_OPEN_STREAMS_PER_TENANT=0)
def test_a_slot_nobody_renews_lapses_after_its_lease_and_a_renewed_one_does_not() -> None:
    tenant, renewed, abandoned = _tenant(), _caller(), _caller()
    kept = open_streams.hold(renewed, tenant, lease=1.0)
    open_streams.hold(abandoned, tenant, lease=1.0)  # its server process died: never renewed, never released
    time.sleep(0.6)
    kept.renew()
    time.sleep(0.6)
    with pytest.raises(open_streams.TooManyStreams):
        open_streams.hold(renewed, tenant, lease=1.0)
    open_streams.hold(abandoned, tenant, lease=1.0).release()  # the abandoned slot has lapsed
    # a tenant bound of 0 counts no tenant: any number of callers
    for _ in range(5):
        open_streams.hold(_caller(), tenant).release()
    kept.release()

"""The tool admin is a client of the tool service: the API's checks as form errors, the approval floor, the audit row."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from audit.models import ConfigChange
from tests.factories import World
from tools.models import Tool, ToolCategory, ToolKind

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _form_data(client: Client, url: str, **changes: Any) -> dict[str, Any]:
    """The admin form as the page shows it (its current or initial values), with ``changes`` typed in."""
    form = client.get(url).context["adminform"].form
    data: dict[str, Any] = {}
    for name in form.fields:
        value = form[name].value()
        value = changes.get(name, value)
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        if value is None:
            continue
        if isinstance(value, bool):
            if value:
                data[name] = "on"
            continue
        data[name] = value
    return data


HTTP_TOOL = {
    "name": "refund_order", "description": "Refund an order.", "kind": ToolKind.HTTP, "category": ToolCategory.WRITE,
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    "timeout_seconds": 10, "result_size_cap": 4000,
}


def test_the_admin_refuses_a_private_allow_list_entry_the_api_refuses(world: World) -> None:
    client = _client(world.operator)
    url = reverse("admin:tools_tool_add")
    data = _form_data(client, url, tenant=world.tenant.pk, **HTTP_TOOL,
                      config={"method": "POST", "url": "https://shop.example.com/r/{order_id}", "allow_hosts": ["10.0.0.0/8"]})
    response = client.post(url, data)
    assert response.status_code == 200, response.content[:500]
    assert "allow_hosts" in response.content.decode() and not Tool.objects.filter(name="refund_order").exists()


def test_a_tool_added_in_the_admin_is_created_by_the_service_with_its_audit_row(world: World) -> None:
    client = _client(world.operator)
    url = reverse("admin:tools_tool_add")
    data = _form_data(client, url, tenant=world.tenant.pk, **HTTP_TOOL,
                      config={"method": "POST", "url": "https://shop.example.com/r/{order_id}"})
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else response.content[:500]
    tool = Tool.objects.get(tenant=world.tenant, name="refund_order")
    change = ConfigChange.objects.get(tenant=world.tenant, action="tool.created", target_repr="refund_order")
    assert change.actor == world.operator and tool.config["url"].endswith("/r/{order_id}")


def test_an_operator_cannot_switch_a_tools_approval_off_in_the_admin(world: World) -> None:
    tool = Tool.objects.create(tenant=world.tenant, requires_approval=True,
                               config={"method": "POST", "url": "https://shop.example.com/r/{order_id}"},
                               **{k: v for k, v in HTTP_TOOL.items() if k not in ("timeout_seconds", "result_size_cap")})
    client = _client(world.operator)
    url = reverse("admin:tools_tool_change", args=[tool.pk])
    response = client.post(url, _form_data(client, url, requires_approval=False))
    assert response.status_code == 200
    assert "only the tenant&#x27;s owner" in response.content.decode() or "only the tenant's owner" in response.content.decode()
    assert Tool.objects.get(pk=tool.pk).requires_approval
    # an ordinary change goes through and is audited
    response = client.post(url, _form_data(client, url, description="Refund an order (only when asked)."))
    assert response.status_code == 302
    assert ConfigChange.objects.filter(tenant=world.tenant, action="tool.updated", actor=world.operator).exists()

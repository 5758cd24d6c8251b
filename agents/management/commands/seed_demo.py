"""``manage.py seed_demo``: the demo tenant, users, agent, tools and API key. Idempotent.

``DEMO_PASSWORD`` and ``DEMO_API_KEY``, when set, are used instead of generated values
(scripted setups need fixed values). Generated ones are kept in ``var/demo-credentials.json``
so a second run prints the same credentials.
"""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from agents.models import Agent, AgentVersion
from tenants import services as tenant_services
from tenants.models import ApiKey, Role, Tenant, hash_key
from tools.services import install_python_tool

ORDER_TOOLS = ["order_desk.query_order", "order_desk.query_logistics", "order_desk.sum_order_totals"]
SYSTEM_PROMPT = (
    "You are the order assistant of a small online shop. Answer questions about orders with the tools; "
    "never invent order data. If an order number is missing, ask for it."
)


def _credentials_file() -> Any:
    return settings.VAR_DIR / "demo-credentials.json"


def _stored() -> dict[str, str]:
    path = _credentials_file()
    return json.loads(path.read_text()) if path.exists() else {}


def _store(values: dict[str, str]) -> None:
    path = _credentials_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values, indent=2))
    path.chmod(0o600)


class Command(BaseCommand):
    help = "Create (or refresh) the demo tenant, users, agent, tools and API key, and print the credentials."

    def handle(self, *args: Any, **options: Any) -> None:
        stored = _stored()
        password = os.environ.get("DEMO_PASSWORD") or stored.get("password") or secrets.token_urlsafe(12)
        api_key = os.environ.get("DEMO_API_KEY") or stored.get("api_key") or ApiKey.generate()[0]
        if ApiKey.prefix_of(api_key) is None:
            raise CommandError("DEMO_API_KEY must look like aok_<8 hex chars>_<secret>, e.g. aok_0123abcd_s3cr3t-value.")
        if len(password) < 10:
            raise CommandError("DEMO_PASSWORD must be at least 10 characters long.")
        with transaction.atomic():
            self._seed(password, api_key)
        if not os.environ.get("DEMO_API_KEY") or not os.environ.get("DEMO_PASSWORD"):
            _store({"password": password, "api_key": api_key})
        self.stdout.write(self.style.SUCCESS("Demo data ready."))
        self.stdout.write(f"  admin / operator / approver password: {password}")
        self.stdout.write(f"  API key (tenant demo, role operator):  {api_key}")
        self.stdout.write("  try: curl -H 'Authorization: Bearer <key>' -H 'Content-Type: application/json' "
                          "-d '{\"agent\":\"order-assistant\",\"input\":\"where is order O202411280001?\"}' "
                          "http://127.0.0.1:8000/api/v1/runs")

    def _seed(self, password: str, api_key: str) -> None:
        User = get_user_model()
        tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo shop"})
        users = {}
        for username, staff, superuser in (("admin", True, True), ("operator", True, False), ("approver", True, False)):
            user, _ = User.objects.get_or_create(username=username, defaults={"email": f"{username}@demo.invalid"})
            user.is_staff, user.is_superuser = staff, superuser
            user.set_password(password)
            user.save()
            users[username] = user
        admin = users["admin"]
        tenant_services.set_membership(tenant=tenant, user=users["operator"], role=Role.OPERATOR, actor=admin)
        tenant_services.set_membership(tenant=tenant, user=users["approver"], role=Role.APPROVER, actor=admin)
        tenant_services.set_membership(tenant=tenant, user=admin, role=Role.OWNER, actor=admin)

        tools = [install_python_tool(tenant=tenant, key=key, actor=admin) for key in ORDER_TOOLS]
        agent, _ = Agent.objects.get_or_create(
            tenant=tenant, slug="order-assistant",
            defaults={"name": "Order assistant", "description": "Answers questions about orders and shipments."},
        )
        if agent.current_version is None:
            version = AgentVersion.objects.create(
                tenant=tenant, agent=agent, number=1, model="demo/planner", system_prompt=SYSTEM_PROMPT,
                tools=[t.name for t in tools], policy={"limits": {"max_recursion": 6}}, created_by=admin, note="seeded",
            )
            agent.current_version = version
            agent.save(update_fields=["current_version"])

        if not ApiKey.objects.filter(hashed=hash_key(api_key)).exists():
            tenant_services.create_api_key(tenant=tenant, name="demo", owner=users["operator"], role=Role.OPERATOR,
                                           actor=admin, raw=api_key)

"""``manage.py seed_demo``: the demo tenant, users, agent, tools and API key. Idempotent.

``DEMO_PASSWORD`` and ``DEMO_API_KEY``, when set, are used instead of generated values
(scripted setups need fixed values). Generated ones are kept in ``var/demo-credentials.json``
so a second run prints the same credentials.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts import services as tenant_services
from agents import services as agent_services
from agents.models import Agent, AgentKind, AgentVersion
from agents.providers import ENV_PROVIDER, env_model
from approvals.reveal import grant_reveal
from marketplace.models import PluginInstall
from marketplace.services import install_plugin
from marketplace.sync import sync_catalog
from tenants.models import ApiKey, Role, Tenant, hash_key
from tenants.scoping import actor_for_user
from tools.models import Tool

#: The refund desk flow (issue #15): order and logistics looked up in parallel, a switch on the amount, a manager's
#: approval above REFUND_THRESHOLD, the refund (its tool's own approval still applies: a flow cannot loosen that
#: floor), and a one-paragraph summary by the llm node (the deterministic planner in embedded mode).
REFUND_THRESHOLD = 200
REFUND_DESK: dict[str, Any] = {
    "description": "Refund an order: look it up, ask a manager above the threshold, refund, summarize.",
    "scopes": ["orders:read", "orders:refund"],
    "max_parallel": 4,
    "input_schema": {
        "type": "object",
        "required": ["order_id", "amount", "reason"],
        "additionalProperties": False,
        "properties": {
            "order_id": {"type": "string", "pattern": "^O\\d{12}$", "description": "the order number, e.g. O202411280001"},
            "amount": {"type": ["string", "number"], "pattern": "^\\d+(\\.\\d{1,2})?$", "minimum": 0.01,
                       "description": "the amount to refund, e.g. \"30.00\""},
            "reason": {"type": "string", "minLength": 1, "maxLength": 500, "description": "why, e.g. \"damaged cup\""},
        },
    },
    "nodes": [
        {"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}},
        {"id": "logistics", "kind": "tool", "tool": "query_logistics", "inputs": {"order_id": "input.order_id"}},
        {"id": "route", "kind": "switch", "after": ["order", "logistics"],
         "cases": [{"when": f"to_number(input.amount) > `{REFUND_THRESHOLD}`", "goto": ["manager"]}],
         "default": ["refund"]},
        {"id": "manager", "kind": "approval", "approver_roles": ["owner", "approver"],
         "inputs": {"order_id": "input.order_id", "amount": "input.amount", "customer": "nodes.order.customer"},
         "preview": "Refund {input.amount} {nodes.order.currency} of order {input.order_id} ({nodes.order.customer}, "
                    f"total {{nodes.order.total}})? It is above the desk's {REFUND_THRESHOLD} threshold."},
        {"id": "refund", "kind": "tool", "tool": "refund_order", "after": ["manager"], "timeout_seconds": 30,
         "inputs": {"order_id": "input.order_id", "amount": "input.amount", "reason": "input.reason"}},
        {"id": "summary", "kind": "llm", "after": ["refund"],
         "prompt": "Order {input.order_id} for {nodes.order.customer} ({nodes.logistics.status}) was refunded "
                   "{nodes.refund.amount} {nodes.refund.currency} (refund {nodes.refund.refund_id}); "
                   "{nodes.refund.remaining_refundable} remains refundable."},
    ],
    "output": "nodes.summary",
}

SYSTEM_PROMPT = (
    "You are the order assistant of a small online shop. Answer questions about orders with the tools; "
    "never invent order data. If an order number is missing, ask for it. Refunds need the amount and the reason, "
    "and a person approves each one before it happens."
)


def _client_host(host: str) -> str:
    """Where a client on this machine reaches ``manage.py serve`` bound to ``host`` (HOST): a wildcard is local."""
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 (a comparison, not a bind)
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


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
        password = settings.DEMO_PASSWORD or stored.get("password") or secrets.token_urlsafe(12)
        api_key = settings.DEMO_API_KEY or stored.get("api_key") or ApiKey.generate()[0]
        if ApiKey.prefix_of(api_key) is None:
            raise CommandError("DEMO_API_KEY must look like aok_<8 hex chars>_<secret>, e.g. aok_0123abcd_s3cr3t-value.")
        if len(password) < 10:
            raise CommandError("DEMO_PASSWORD must be at least 10 characters long.")
        with transaction.atomic():
            self._seed(password, api_key)
        if not settings.DEMO_API_KEY or not settings.DEMO_PASSWORD:
            _store({"password": password, "api_key": api_key})
        self.stdout.write(self.style.SUCCESS("Demo data ready."))
        self.stdout.write(f"  admin / operator / approver password: {password}")
        self.stdout.write(f"  API key (tenant demo, role operator):  {api_key}")
        if not settings.OPENAI_BASE_URL:
            self.stdout.write("  order-assistant-llm needs OPENAI_BASE_URL (and OPENAI_API_KEY) or a provider named 'openai'.")
        self.stdout.write("  try: curl -H 'Authorization: Bearer <key>' -H 'Content-Type: application/json' "
                          "-d '{\"agent\":\"order-assistant\",\"input\":\"where is order O202411280001?\"}' "
                          f"http://{_client_host(settings.SERVE_HOST)}:{settings.SERVE_PORT}/api/v1/runs")
        self.stdout.write("  a flow: -d '{\"flow\":\"refund-desk\",\"input\":{\"order_id\":\"O202411280001\","
                          "\"amount\":\"30.00\",\"reason\":\"damaged cup\"}}' (README: Flows)")

    def _order_desk(self, tenant: Tenant, admin: Any) -> list[Tool]:
        """The order-desk plugin, installed for the demo tenant: its tools, refund_order (needs approval) included."""
        sync_catalog()
        install = PluginInstall.objects.filter(tenant=tenant, plugin_key="order-desk").first()
        if install is None:
            # An earlier seed made the tools as the tenant's own; the install takes them over.
            install = install_plugin(tenant=tenant, plugin_key="order-desk", actor=actor_for_user(admin))
        return list(Tool.objects.filter(plugin_install=install).order_by("name"))

    def _refund_desk(self, tenant: Tenant, admin: Any) -> None:
        """The refund desk flow, through the same services as the API (checked at save, audited)."""
        flow = Agent.objects.filter(tenant=tenant, slug="refund-desk").first()
        if flow is None:
            flow = agent_services.create_agent(actor=actor_for_user(admin), tenant=tenant, slug="refund-desk",
                                               name="Refund desk", description=REFUND_DESK["description"],
                                               kind=AgentKind.FLOW)
        if flow.current_version_id is None:
            agent_services.create_version(actor=actor_for_user(admin), agent=flow, make_current=True, model="demo/planner",
                                          definition=REFUND_DESK, note="seeded")

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
        by_admin = actor_for_user(admin)
        tenant_services.set_membership(tenant=tenant, user=users["operator"], role=Role.OPERATOR, actor=by_admin)
        tenant_services.set_membership(tenant=tenant, user=users["approver"], role=Role.APPROVER, actor=by_admin)
        tenant_services.set_membership(tenant=tenant, user=admin, role=Role.OWNER, actor=by_admin)
        # The demo approver may reveal the fields a tool masks (the refund's reason); each reveal is audited.
        grant_reveal(tenant=tenant, user=users["approver"], actor=by_admin)

        tools = self._order_desk(tenant, admin)
        agent, _ = Agent.objects.get_or_create(
            tenant=tenant, slug="order-assistant",
            defaults={"name": "Order assistant", "description": "Answers questions about orders and shipments."},
        )
        if agent.current_version is None:
            version = AgentVersion.objects.create(
                tenant=tenant, agent=agent, number=1, model="demo/planner", system_prompt=SYSTEM_PROMPT,
                tools=[t.name for t in tools], policy={"limits": {"max_recursion": 6}}, created_by=admin, note="seeded",
            )
            agent_services.set_current_version(actor=by_admin, agent=agent, version=version, reason="seeded")
        # The same agent on the default provider: the implicit "openai" one built from OPENAI_BASE_URL
        # (and OPENAI_API_KEY, OPENAI_MODEL) when the worker has it; see agents/providers.py.
        llm, _ = Agent.objects.get_or_create(
            tenant=tenant, slug="order-assistant-llm",
            defaults={"name": "Order assistant (LLM)", "description": "The order assistant on the default model provider."},
        )
        if llm.current_version is None:
            version = AgentVersion.objects.create(
                tenant=tenant, agent=llm, number=1, model=f"{ENV_PROVIDER}/{env_model()}", system_prompt=SYSTEM_PROMPT,
                tools=[t.name for t in tools], policy={"limits": {"max_recursion": 6}}, created_by=admin, note="seeded",
            )
            agent_services.set_current_version(actor=by_admin, agent=llm, version=version, reason="seeded")

        self._refund_desk(tenant, admin)

        if not ApiKey.objects.filter(hashed=hash_key(api_key)).exists():
            tenant_services.create_api_key(tenant=tenant, name="demo", owner=users["operator"], role=Role.OPERATOR,
                                           actor=by_admin, raw=api_key)

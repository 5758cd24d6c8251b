"""``/ws/approvals/``: the approver inbox's live feed (requests arriving or decided elsewhere)."""

from __future__ import annotations

from typing import Any

from core import live
from tenants.feeds import TenantFeedConsumer


class ApprovalsConsumer(TenantFeedConsumer):
    tenant_action = "review"  # viewers do not see approval requests

    def group_for(self, tenant_id: int) -> str:
        return live.tenant_approvals_group(tenant_id)

    async def approval_changed(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "approval", **message["approval"]})

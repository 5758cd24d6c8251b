"""A local refund endpoint that records what reaches it, and the approval-gated HTTP tool that calls it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tools.models import Tool, ToolCategory, ToolKind


class RefundTarget(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)) or 0)
        RefundTarget.requests.append({"path": self.path, "key": self.headers.get("Idempotency-Key"), "body": body.decode()})
        payload = json.dumps({"refund_id": f"R{len(RefundTarget.requests)}", "status": "refunded"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        return


@contextmanager
def serve_refund_target() -> Iterator[str]:
    """The target's base URL while the block runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), RefundTarget)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def add_refund_tool(world: Any, target: str) -> Tool:
    """``refund_order``: POST <target>/refunds/<order_id>, needs approval, listed by the world's agent version."""
    tool = Tool.objects.create(
        tenant=world.tenant,
        name="refund_order",
        kind=ToolKind.HTTP,
        category=ToolCategory.WRITE,
        idempotent=False,
        description="Refund an order (refund, 退款). Use only when the user asks for a refund of an order.",
        parameters={
            "type": "object",
            "properties": {"order_id": {"type": "string", "pattern": "^O\\d{12}$"}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
        config={"method": "POST", "url": target + "/refunds/{order_id}", "allow_hosts": ["127.0.0.1"]},
        requires_approval=True,
    )
    world.version.tools = [*world.version.tools, "refund_order"]
    world.version.save(update_fields=["tools"])
    return tool

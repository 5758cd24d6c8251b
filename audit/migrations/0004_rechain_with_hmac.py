"""Re-chain existing audit rows with the keyed hash (HMAC) and put existing configuration changes in their chains.

The chains start again from what the database holds at this migration: rows were unkeyed (tool calls) or not
chained at all (configuration changes) until now, so nothing earlier can be vouched for beyond this point.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def rechain(apps: Any, schema_editor: Any) -> None:
    from audit import chain as keyed  # the same digests the running code computes

    ToolCallAudit = apps.get_model("audit", "ToolCallAudit")
    AuditChainHead = apps.get_model("audit", "AuditChainHead")
    ConfigChange = apps.get_model("audit", "ConfigChange")
    ConfigChainHead = apps.get_model("audit", "ConfigChainHead")

    for head in AuditChainHead.objects.all():
        prev, seq = "", 0
        for row in ToolCallAudit.objects.filter(tenant_id=head.tenant_id, chain_seq__isnull=False).order_by("chain_seq"):
            seq = row.chain_seq
            row.prev_hash = prev
            row.row_hash = keyed.digest(row)
            ToolCallAudit.objects.filter(pk=row.pk).update(prev_hash=row.prev_hash, row_hash=row.row_hash)
            prev = row.row_hash
        AuditChainHead.objects.filter(pk=head.pk).update(seq=seq, hash=prev)

    heads: dict[str, tuple[int, str]] = {}
    for row in ConfigChange.objects.order_by("created_at", "id"):
        name = keyed.change_chain(row.tenant_id)
        seq, prev = heads.get(name, (0, ""))
        row.chain, row.chain_seq, row.prev_hash = name, seq + 1, prev
        row.row_hash = keyed.change_digest(row)
        ConfigChange.objects.filter(pk=row.pk).update(chain=row.chain, chain_seq=row.chain_seq, prev_hash=row.prev_hash,
                                                      row_hash=row.row_hash)
        heads[name] = (row.chain_seq, row.row_hash)
    ConfigChainHead.objects.bulk_create([ConfigChainHead(chain=name, seq=seq, hash=h) for name, (seq, h) in heads.items()])


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_config_change_chain")]
    operations = [migrations.RunPython(rechain, migrations.RunPython.noop)]

"""The run table keeps a fifth of each page free, so a step's update of its run can stay on the row's page.

A running run's row is updated at every step; without room on its page, PostgreSQL writes the new version elsewhere
and adds an entry for it to every index of the table (eighteen), a step after step. With room, and no indexed column
changed (agents/store.py renews the lease a third of its length at a time, not every step), the update is HOT: in
place, no index touched. Only pages written from now on keep the room; ``VACUUM FULL agents_run`` rewrites the rest.
"""

from django.db import migrations


def _set(fillfactor: int | None):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return  # SQLite has no such storage parameter
        table = schema_editor.quote_name(apps.get_model("agents", "Run")._meta.db_table)
        schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {fillfactor})" if fillfactor
                              else f"ALTER TABLE {table} RESET (fillfactor)")

    return apply


class Migration(migrations.Migration):

    dependencies = [
        ('agents', '0006_trace_references_unchecked'),
    ]

    operations = [
        migrations.RunPython(_set(80), _set(None)),
    ]

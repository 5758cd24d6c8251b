from __future__ import annotations

from django.apps import AppConfig


class RoofConfig(AppConfig):
    """The roof (the composition root) as an app, for what only it wires: the deployment checks of our own
    (config/checks.py), psycopg's compiled timestamp loader on every new PostgreSQL connection (config/pg_timestamps.py)
    and ``manage.py serve`` (config/management/commands/serve.py). No app imports it (``.importlinter``)."""

    name = "config"
    verbose_name = "Composition root"

    def ready(self) -> None:
        import config.checks  # noqa: F401 - registers the deployment checks of our own, beside Django's
        from config import pg_timestamps

        pg_timestamps.connect()  # PostgreSQL in UTC: psycopg's compiled timestamp loader on every new connection

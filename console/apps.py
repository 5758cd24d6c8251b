from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The operators' dashboard: run list, live run trace, spend. Reads through the tenancy gate only."""

    name = "console"
    verbose_name = "Console"

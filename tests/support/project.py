"""The project's own packages, derived rather than listed, so a structural guard cannot miss an app added later.

A hand-written list missed ``flows`` and ``releases`` in three guards and in ``scripts/import_stats.py`` (issue #52).
"""

from __future__ import annotations

from pathlib import Path

from django.apps import apps

ROOT = Path(__file__).resolve().parents[2]


def first_party_apps() -> list[str]:
    """The INSTALLED_APPS that are top-level packages of this repository (not Django's, DRF's, axes'...; a venv
    inside the clone is not top-level)."""
    return sorted(config.name for config in apps.get_app_configs() if Path(config.path).resolve().parent == ROOT)


def first_party_packages() -> list[str]:
    """The apps (the roof, config, among them) and the plain packages they are built on (core, runtime, llm,
    egress): every top-level package of the repository but the tests."""
    plain = [path.parent.name for path in ROOT.glob("*/__init__.py") if path.parent.name != "tests"]
    return sorted(set(first_party_apps()) | set(plain))

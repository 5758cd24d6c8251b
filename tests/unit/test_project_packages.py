"""Issue #52: the structural guards and scripts/import_stats.py count every first-party package, from INSTALLED_APPS."""

from __future__ import annotations

import importlib.util

from django.conf import settings

from tests.support.project import ROOT, first_party_apps, first_party_packages


def _import_stats() -> object:
    spec = importlib.util.spec_from_file_location("import_stats", ROOT / "scripts" / "import_stats.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_first_party_apps_are_the_installed_apps_of_this_repository() -> None:
    assert first_party_apps() == sorted(app for app in settings.INSTALLED_APPS if (ROOT / app / "__init__.py").is_file())
    assert {"flows", "releases"} <= set(first_party_apps())


def test_import_stats_reads_every_first_party_package() -> None:
    assert list(_import_stats().APPS) == first_party_packages()  # type: ignore[attr-defined]

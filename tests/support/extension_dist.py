"""A real installed distribution contributing hook and interceptor extensions, for the tests.

``install(tmp_path, monkeypatch)`` writes a tiny package and its ``agentops_fx_ext-1.0.dist-info`` (METADATA and
entry_points.txt) into ``tmp_path`` and puts it on ``sys.path``, so ``importlib.metadata`` finds the entry points
exactly as it finds a pip-installed package's. ``cleanup()`` forgets the modules and the extension table.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from runtime import plugins

PACKAGE_SOURCE = '''
from pydantic import BaseModel, ConfigDict

from runtime.hooks import HookPosition, HookResult


class RedactConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    secret: str
    replacement: str = "[redacted]"


class Redact:
    """A model interceptor: hides a secret from every model request."""

    config_model = RedactConfig
    seen = []

    def __init__(self, config):
        self.config = config

    def __call__(self, request, call_next):
        Redact.seen.append([m.get("content") for m in request.messages])
        for message in request.messages:
            if isinstance(message.get("content"), str):
                message["content"] = message["content"].replace(self.config.secret, self.config.replacement)
        return call_next(request)


class TagConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    value: str


class Tag:
    """A hook: sets a business key before the agent starts."""

    config_model = TagConfig
    positions = frozenset({HookPosition.BEFORE_AGENT})

    def __init__(self, config):
        self.config = config

    def __call__(self, ctx):
        return HookResult(updates={self.config.key: self.config.value}, reason="tagged by a plugin")


class SuffixConfig(BaseModel):
    suffix: str = " (checked)"
    max_chars: int = 1000


class Suffix:
    """A tool interceptor: appends a note to every tool result."""

    config_model = SuffixConfig

    def __init__(self, config):
        self.config = config

    def __call__(self, call, ctx, call_next):
        outcome = call_next(call, ctx)
        outcome.content = (outcome.content + self.config.suffix)[: self.config.max_chars]
        return outcome


class NotCallable:
    def __init__(self, config):
        self.config = config


class NoPositions:
    def __init__(self, config):
        self.config = config

    def __call__(self, ctx):
        return None


def a_function(request, call_next):
    return call_next(request)
'''

OTHER_SOURCE = '''
IMPORTED = True


class Other:
    def __init__(self, config):
        self.config = config

    def __call__(self, request, call_next):
        return call_next(request)
'''

ENTRY_POINTS = """\
[agentops.hooks]
fx.tag = agentops_fx_ext:Tag
fx.no_positions = agentops_fx_ext:NoPositions

[agentops.model_interceptors]
fx.redact = agentops_fx_ext:Redact
fx.missing = agentops_fx_missing_module:Nope
fx.boom = agentops_fx_boom:Boom
fx.not_callable = agentops_fx_ext:NotCallable
fx.function = agentops_fx_ext:a_function
Bad-Name = agentops_fx_ext:Redact
fx.other = agentops_fx_other:Other

[agentops.tool_interceptors]
fx.suffix = agentops_fx_ext:Suffix
"""

MODULES = ("agentops_fx_ext", "agentops_fx_other", "agentops_fx_boom", "agentops_fx_missing_module", "agentops_fx_unlisted")


def write_dist(root: Path, name: str, entry_points: str, version: str = "1.0") -> None:
    dist = root / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist / "entry_points.txt").write_text(entry_points)


def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    (root / "agentops_fx_ext.py").write_text(PACKAGE_SOURCE)
    (root / "agentops_fx_other.py").write_text(OTHER_SOURCE)
    (root / "agentops_fx_boom.py").write_text("raise RuntimeError('boom at import')\n")
    write_dist(root, "agentops-fx-ext", ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(root))  # also invalidates the import caches
    cleanup()
    return root


def cleanup() -> None:
    for name in MODULES:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
    plugins.clear_cache()

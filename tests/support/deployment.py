"""The deployment's environment, as the settings read it at start-up (config/settings.py), set for one test.

Code reads these from ``settings``, never ``os.environ``; a test sets them through pytest-django's ``settings``
fixture, which restores them afterwards. ``value=None`` unsets one.
"""

from __future__ import annotations

from typing import Any

_PREFIXED = {"TOOL_SECRET_": "TOOL_SECRETS", "PROVIDER_SECRET_": "PROVIDER_SECRETS"}
_DIRECT = {"OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "PROVIDER_KEY_SECRET", "DEMO_PASSWORD", "DEMO_API_KEY"}


def set_env(settings: Any, name: str, value: Any = None) -> None:
    for prefix, setting in _PREFIXED.items():
        if name.startswith(prefix):
            secrets = dict(getattr(settings, setting))
            secrets.pop(name[len(prefix):], None)
            if value is not None:
                secrets[name[len(prefix):]] = value
            setattr(settings, setting, secrets)
            return
    if name == "OPENAI_MODELS":
        settings.OPENAI_MODELS = value or {}
    elif name in _DIRECT:
        setattr(settings, name, value or "")
    else:
        raise KeyError(f"{name} is not a deployment setting this helper knows")

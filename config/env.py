"""Typed, strict readers for the environment. A bad value stops start-up with a message naming the variable."""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None else value.strip()


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false (also 1/0, yes/no, on/off), got {value!r}.")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}.") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {number}.")
    return number


def env_count_or_off(name: str, default: int) -> int | None:
    """A count (0 or more), or ``off`` (``None``)."""
    value = (_raw(name) or "").strip().lower()
    if value == "":
        return default
    if value == "off":
        return None
    if not value.isdigit():
        raise ImproperlyConfigured(f"{name} must be a number (0 or more) or off, got {value!r}.")
    return int(value)


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = _raw(name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number (e.g. 2.5), got {value!r}.") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name} must be a finite number, got {value!r}.")
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {number}.")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def env_str(name: str, default: str = "") -> str:
    value = _raw(name)
    return default if value is None else value


_RATE = re.compile(r"^[1-9][0-9]*/(s|sec|second|m|min|minute|h|hour|d|day)$")


def env_rate(name: str, default: str) -> str | None:
    """A request rate like ``1200/min`` (per second, minute, hour or day); ``off`` means no limit (``None``)."""
    value = _raw(name) or default
    if value.lower() == "off":
        return None
    if not _RATE.match(value):
        raise ImproperlyConfigured(f"{name} must be a rate like 1200/min (per s, min, hour or day) or off, got {value!r}.")
    return value


def env_header(name: str) -> str | None:
    """An HTTP header name (e.g. ``X-Forwarded-For``) as its ``request.META`` key (``HTTP_X_FORWARDED_FOR``); unset: None."""
    value = _raw(name)
    if not value:
        return None
    if not re.fullmatch(r"[A-Za-z0-9-]+", value):
        raise ImproperlyConfigured(f"{name} must be an HTTP header name such as X-Forwarded-For or X-Real-IP, got {value!r}.")
    return "HTTP_" + value.upper().replace("-", "_")


def env_database(name: str, default: str) -> dict[str, Any]:
    url = _raw(name) or default
    if not url.startswith(("sqlite://", "postgres://", "postgresql://", "pgsql://")):
        raise ImproperlyConfigured(
            f"{name} must be a sqlite:/// or postgres:// URL "
            f"(e.g. postgres://user:pass@127.0.0.1:5432/agentops), got {url.split('@')[-1]!r}."
        )
    try:
        return environ.Env.db_url_config(url)
    except Exception as exc:  # environ raises a variety of errors on malformed URLs
        raise ImproperlyConfigured(f"{name} could not be parsed: {exc}") from None


def env_redis(name: str) -> str | None:
    url = _raw(name)
    if not url:
        return None
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"{name} must be a redis:// or rediss:// URL (e.g. redis://127.0.0.1:6379/0), got {url!r}.")
    return url


def secret_key(name: str, *, debug: bool, local_file: Path) -> str:
    """The SECRET_KEY: from the environment; in development, generated once and kept in a local file."""
    value = _raw(name)
    if value:
        if len(value) < 32 and not debug:
            raise ImproperlyConfigured(f"{name} must be at least 32 characters long when DEBUG is off.")
        return value
    if not debug:
        raise ImproperlyConfigured(
            f"{name} is required when DEBUG is off. Set it to a long random string, "
            f'e.g. python -c "import secrets; print(secrets.token_urlsafe(50))".'
        )
    if local_file.exists():
        return local_file.read_text().strip()
    local_file.parent.mkdir(parents=True, exist_ok=True)
    generated = secrets.token_urlsafe(50)
    local_file.write_text(generated)
    local_file.chmod(0o600)
    return generated


def env_key(name: str, *, min_length: int = 32) -> str:
    """An optional secret key: empty when unset, at least ``min_length`` characters when set."""
    value = _raw(name) or ""
    if value and len(value) < min_length:
        raise ImproperlyConfigured(f"{name} must be at least {min_length} characters long (a random string, kept outside the database).")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _raw(name)
    if value is None or value == "":
        return default
    if value.lower() not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {value!r}.")
    return value.lower()


def env_port(name: str, default: int) -> int:
    value = _raw(name)
    if value is None or value == "":
        return default
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ImproperlyConfigured(f"{name} must be a TCP port number (1-65535), got {value!r}.")
    return int(value)


def env_json_object(name: str) -> dict[str, Any]:
    """A JSON object (``{}`` when unset); anything else stops start-up."""
    value = _raw(name)
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a JSON object: {exc}.") from None
    if not isinstance(parsed, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object, got {type(parsed).__name__}.")
    return parsed


def env_prefixed(prefix: str) -> dict[str, str]:
    """Every ``<prefix><NAME>`` variable as ``{NAME: value}``: deployment secrets, named in configuration by NAME."""
    found = {}
    for key, value in os.environ.items():
        if key.startswith(prefix):
            name = key[len(prefix):]
            if not re.fullmatch(r"[A-Za-z0-9_]+", name):
                raise ImproperlyConfigured(f"{key}: after {prefix} use only letters, digits and _ (the NAME of secret:NAME).")
            found[name] = value
    return found

"""Model providers as configured by operators: secrets at rest, validation, and rows -> ``ProviderConfig``.

Secrets. A provider's API key is stored encrypted (Fernet, with a key derived from
``PROVIDER_KEY_SECRET`` when set, else from ``SECRET_KEY``). Default headers are stored
encrypted as a whole (their values often carry tokens). Neither is ever shown back: displays
say "set"/"not set" and list header names only. Rotating ``PROVIDER_KEY_SECRET``/``SECRET_KEY``
makes stored keys unreadable; a run then fails with a message that says to enter the key again.

Deployment secrets. Tenants never name environment variables: a tenant's provider could point
at the tenant's own host and carry the worker's ``SECRET_KEY`` there. The key or a header value
may instead be ``secret:NAME``, read from the environment variable ``PROVIDER_SECRET_<NAME>``
(never any other name), and only for a shared provider (no tenant: set up by a superuser) or for
a tenant's provider when a platform administrator granted ``NAME`` to the tenant
(``tenant.settings["provider_secrets"]``, as tools have ``tool_secrets``). ``env:NAME`` is refused
when saved, and rows saved before this rule are refused when used. A reference that cannot be
used, whether the variable is missing or the reference is not allowed, gives the same message.

Egress. A tenant's own OpenAI-compatible provider is called through the tools' SSRF guard
(``egress/guard.py``): no loopback, private, link-local or metadata address unless listed in
``PROVIDER_EGRESS_ALLOW`` (comma-separated hosts/CIDRs, each optionally with ``:port``). The client
connects to the address it validated, for every request (no DNS-rebinding window), and a tenant
provider's error messages never quote the target's response body. Shared providers and the environment
default are set up by the platform's operators and are not restricted.

Names. ``demo`` is the built-in deterministic provider (no network) and cannot be redefined.
When ``OPENAI_BASE_URL`` is set, every tenant also gets an implicit provider named ``openai``
built from the environment at gateway-build time: ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
``OPENAI_MODEL`` (the demo agent's model, default ``gpt-4o-mini``) and, optionally,
``OPENAI_MODELS`` (a JSON price table of the same shape as a provider's ``models``). A provider
row named ``openai`` (the tenant's own or a shared one) replaces it; a tenant's own row
replaces a shared row of the same name.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from collections.abc import Collection, Mapping
from typing import Annotated, Any
from urllib.parse import urlsplit

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from pydantic import Field, ValidationInfo, field_validator, model_validator

from agents.models import Provider, ProviderKind
from egress.guard import TENANT_ANSWER_BYTES, guarded_client
from llm import ModelInfo, OpenAICompatibleClient, ProviderConfig, RateLimit
from runtime.documents import Document, Leaf, choice, flag, integer, number, parse, pattern, problem, problems, problems_of

BUILTIN_PROVIDER = "demo"
ENV_PROVIDER = "openai"
DEFAULT_ENV_MODEL = "gpt-4o-mini"
RESERVED_NAMES = frozenset({BUILTIN_PROVIDER})

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_SECRET_REF = re.compile(r"^secret:([A-Za-z0-9_]{1,64})$")
#: The only environment variables a provider row may read: ``PROVIDER_SECRET_<NAME>``.
SECRET_PREFIX = "PROVIDER_SECRET_"
TENANT_ENV_REFUSED = "tenant providers cannot reference environment variables; paste the key, it is stored encrypted"
PLATFORM_ENV_REFUSED = "env: references are not read; write secret:NAME, read from the environment variable PROVIDER_SECRET_NAME"
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
MODELS_EXAMPLE = '{"gpt-4o-mini": {"context_window": 128000, "price_in_per_1m": 0.15, "price_out_per_1m": 0.6}}'


class SecretError(ValueError):
    """A stored secret cannot be read; the message says what to do and never contains the secret."""


# -- secrets at rest ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _fernet_for(material: str) -> Fernet:
    digest = hashlib.sha256(b"agentops-provider-secrets:" + material.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def _fernet() -> Fernet:
    return _fernet_for(settings.PROVIDER_KEY_SECRET or settings.SECRET_KEY)


def encrypt_secret(value: str) -> str:
    return _fernet().encrypt(value.encode()).decode()


def decrypt_secret(token: str, what: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except (InvalidToken, ValueError):
        raise SecretError(
            f"{what} cannot be decrypted: it was stored under another PROVIDER_KEY_SECRET/SECRET_KEY; enter it again"
        ) from None


def secret_reference(raw: str) -> str | None:
    """``"secret:OPENAI"`` -> ``"OPENAI"`` (read from ``PROVIDER_SECRET_OPENAI``); anything else -> None."""
    match = _SECRET_REF.match(raw.strip())
    return match.group(1) if match else None


def _looks_like_reference(raw: str) -> bool:
    """``env:...``/``secret:...`` in any spelling: never stored as a literal key, so never sent as one."""
    return raw.strip().lower().startswith(("env:", "secret:"))


def granted_secrets(tenant: Any) -> frozenset[str]:
    """The deployment secrets a platform administrator granted to ``tenant`` (``settings["provider_secrets"]``)."""
    listed = (getattr(tenant, "settings", None) or {}).get("provider_secrets", []) if tenant is not None else []
    return frozenset(str(name) for name in listed) if isinstance(listed, list) else frozenset()


def _reference_problem(raw: str, *, platform: bool, granted: Collection[str]) -> str | None:
    """Why ``raw`` may not be saved as a key or header value of this provider (None: fine)."""
    if not _looks_like_reference(raw):
        return None
    name = secret_reference(raw)
    if name is not None and (platform or name in granted):
        return None
    if platform and raw.strip().lower().startswith("secret:"):
        return "'secret:' must be followed by a name of letters, digits and '_' (read from PROVIDER_SECRET_NAME)"
    return PLATFORM_ENV_REFUSED if platform else TENANT_ENV_REFUSED


def _unusable(what: str) -> SecretError:
    """The one message for any reference that cannot be used: it never says whether a variable exists."""
    return SecretError(f"{what} is not configured: paste the key again (it is stored encrypted)")


def _resolve(value: str, what: str, provider: Provider) -> str:
    """A stored key or header value, with ``secret:NAME`` read from ``PROVIDER_SECRET_<NAME>`` when allowed."""
    if not _looks_like_reference(value):
        return value
    name = secret_reference(value)
    platform = provider.tenant_id is None
    if name is None or not (platform or name in granted_secrets(provider.tenant)):
        raise _unusable(what)
    resolved = settings.PROVIDER_SECRETS.get(name, "")  # PROVIDER_SECRET_<NAME>, read at start-up
    if not resolved:
        raise _unusable(what)
    return resolved


def key_status(provider: Provider) -> str:
    """What the admin and the API show instead of the key."""
    if provider.api_key_env:
        if secret_reference(provider.api_key_env) is not None:
            return f"set (from {provider.api_key_env})"
        return "not usable (an environment reference, no longer read): paste the key again"
    return "set (encrypted)" if provider.api_key_encrypted else "not set"


def masked_headers(provider: Provider) -> dict[str, str]:
    return {name: "***" for name in provider.default_header_names or []}


# -- validation ---------------------------------------------------------------------------------


class ModelEntry(Document):
    """One model a provider offers: its context window and prices (the gateway's ``ModelInfo``)."""

    context_window: Annotated[int, integer(1), Field(description="the model's context window in tokens")] = 128_000
    price_in_per_1m: Annotated[float, number(nullable=False, minimum=0), Field(description="the price per 1M input tokens")] = 0.0
    price_out_per_1m: Annotated[float, number(nullable=False, minimum=0), Field(description="the price per 1M output tokens")] = 0.0

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise problem(f"must be an object with {', '.join(cls.model_fields)}, e.g. {MODELS_EXAMPLE}", value)
        return value

    def info(self) -> ModelInfo:
        return ModelInfo(self.context_window, float(self.price_in_per_1m), float(self.price_out_per_1m))


ModelName = Annotated[str, pattern(r"^\S+$", "a model name must be non-empty and contain no spaces")]


class ProviderModels(Document):
    """A provider's ``models`` table (also ``OPENAI_MODELS``): model name -> :class:`ModelEntry`."""

    models: dict[ModelName, ModelEntry] = {}

    @field_validator("models", mode="before")
    @classmethod
    def _an_object(cls, value: Any) -> Any:
        return _table(value)


def _table(value: Any) -> Any:
    if not isinstance(value, dict):
        raise problem(f"must be an object of model name -> settings, e.g. {MODELS_EXAMPLE}", value)
    return value


def _header_name(value: Any) -> str:
    if not isinstance(value, str) or not _HEADER_NAME.match(value):
        raise problem("is not a valid header name (letters, digits and !#$%&'*+.^_`|~-)")
    if value.lower() == "authorization":
        raise problem("set the API key field instead of an Authorization header")
    return value


def _header_value(value: Any) -> str:
    if not isinstance(value, str) or not value or "\r" in value or "\n" in value:
        raise problem("must be a non-empty string on one line")
    return value


class ProviderHeaders(Document):
    """``default_headers``; secret references need ``context={"platform": bool, "granted": names}``."""

    default_headers: dict[
        Annotated[str, Leaf(_header_name, {"type": "string", "pattern": _HEADER_NAME.pattern})],
        Annotated[str, Leaf(_header_value, {"type": "string", "minLength": 1})],
    ] = {}

    @field_validator("default_headers", mode="before")
    @classmethod
    def _an_object(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise problem('must be an object of header name -> value, e.g. {"OpenAI-Organization": "org-123"}')
        return value

    @field_validator("default_headers")
    @classmethod
    def _references(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        scope = info.context or {}
        platform, granted = bool(scope.get("platform")), scope.get("granted", ())
        found = [(name, _reference_problem(header, platform=platform, granted=granted)) for name, header in value.items()]
        if any(why for _, why in found):
            raise problems_of(f"$.{name}: {why}" for name, why in found if why)
        return value


def check_models(value: Any) -> list[str]:
    """Problems of a ``models`` table, each naming the entry and field (``models.gpt-4o-mini.price_in_per_1m``)."""
    return problems(ProviderModels, {"models": value})[1]


def check_headers(value: Any, *, platform: bool = False, granted: Collection[str] = ()) -> list[str]:
    """Problems of ``default_headers``; ``platform`` is a shared provider, ``granted`` the tenant's secret grants."""
    return problems(ProviderHeaders, {"default_headers": value}, context={"platform": platform, "granted": granted})[1]


def check_api_key(value: str, *, platform: bool = False, granted: Collection[str] = ()) -> list[str]:
    """Problems of an API key as typed; ``platform`` is a shared provider, ``granted`` the tenant's secret grants."""
    problem = _reference_problem(value, platform=platform, granted=granted)
    if problem:
        return [f"api_key: {problem}"]
    if any(ch.isspace() for ch in value):
        return ["api_key: must contain no spaces or line breaks (paste the key alone)"]
    return []


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise problem("use letters, digits, '.', '_' or '-' (no '/')", value)
    if value in RESERVED_NAMES:
        raise problem(f"{value!r} is the built-in deterministic provider; choose another name")
    return value


def _limit(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise problem("must be a positive integer, or empty for unlimited", value)
    return value


class ProviderSettings(Document):
    """A provider's plain settings as typed (only those given are checked: a form or a PATCH sends some)."""

    name: Annotated[str | None, Leaf(_name, {"type": "string", "pattern": _NAME.pattern})] = None
    kind: Annotated[str | None, choice(*ProviderKind.values)] = None
    base_url: Annotated[str | None, Leaf(lambda v: v, {"type": "string", "format": "uri"}, nullable=True)] = None
    timeout: Annotated[float | None, number(nullable=False, maximum=600), Field(description="seconds")] = None
    max_retries: Annotated[int | None, integer(0, maximum=5)] = None
    models: Annotated[dict[ModelName, ModelEntry] | None, Field(description="model name -> settings")] = None
    requests_per_minute: Annotated[int | None, Leaf(_limit, {"type": "integer", "minimum": 1}, nullable=True)] = None
    tokens_per_minute: Annotated[int | None, Leaf(_limit, {"type": "integer", "minimum": 1}, nullable=True)] = None
    enabled: Annotated[bool | None, flag(nullable=True)] = None

    @field_validator("models", mode="before")
    @classmethod
    def _models_an_object(cls, value: Any) -> Any:
        return _table(value)

    @field_validator("base_url")
    @classmethod
    def _an_http_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        kind = (info.context or {}).get("kind", ProviderKind.OPENAI_COMPATIBLE)  # as given, even when it is wrong
        if not value:
            if kind == ProviderKind.OPENAI_COMPATIBLE:
                raise problem("an OpenAI-compatible provider needs one, e.g. https://api.openai.com/v1")
            return value
        parts = urlsplit(value) if isinstance(value, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc or any(ch.isspace() for ch in value):
            raise problem("must be an http(s) URL such as https://api.openai.com/v1", value)
        return value


def check_fields(values: Mapping[str, Any]) -> dict[str, list[str]]:
    """Every problem of a provider's settings, by field (only the fields present are checked)."""
    given = {("models" if key == "offered_models" else key): value for key, value in values.items()}
    if "base_url" in given:
        given["base_url"] = given["base_url"] or ""
    errors: dict[str, list[str]] = {}
    for found in problems(ProviderSettings, given, context={"kind": given.get("kind", ProviderKind.OPENAI_COMPATIBLE)})[1]:
        errors.setdefault(re.split(r"[.:\[]", found, maxsplit=1)[0], []).append(found)
    return errors


# -- rows -> gateway configuration --------------------------------------------------------------


def model_table(raw: Mapping[str, Any], what: str = "provider models") -> dict[str, ModelInfo]:
    """The gateway's table from a stored (or ``OPENAI_MODELS``) one; raises ``DocumentError`` naming each problem."""
    table = parse(ProviderModels, {"models": dict(raw)}, what=what)
    return {name: entry.info() for name, entry in table.models.items()}


def stored_headers(provider: Provider) -> dict[str, str]:
    if not provider.default_headers_encrypted:
        return {}
    text = decrypt_secret(provider.default_headers_encrypted, f"the default headers of provider {provider.name!r}")
    headers = json.loads(text)
    return {str(k): str(v) for k, v in headers.items()}


def provider_config(provider: Provider) -> ProviderConfig:
    """The gateway's view of a row, secrets resolved. Raises ``SecretError``/``ValueError`` with a readable reason."""
    what = f"the API key of provider {provider.name!r}"
    if provider.api_key_env:
        # Only ``secret:NAME`` is stored here now; a bare variable name (saved before) is refused, never read.
        api_key = _resolve(provider.api_key_env if _looks_like_reference(provider.api_key_env) else "env:", what, provider)
    elif provider.api_key_encrypted:
        api_key = decrypt_secret(provider.api_key_encrypted, what)
    else:
        api_key = ""
    headers = {
        name: _resolve(value, f"header {name} of provider {provider.name!r}", provider) for name, value in stored_headers(provider).items()
    }
    limit = None
    if provider.requests_per_minute or provider.tokens_per_minute:
        limit = RateLimit(requests_per_minute=provider.requests_per_minute, tokens_per_minute=provider.tokens_per_minute)
    return ProviderConfig(
        name=provider.name,
        kind=provider.kind,  # type: ignore[arg-type]
        base_url=provider.base_url,
        api_key=api_key,
        default_headers=headers,
        timeout=float(provider.timeout),
        max_retries=int(provider.max_retries),
        models=model_table(provider.offered_models or {}, f"models of provider {provider.name!r}"),
        rate_limit=limit,
    )


def env_model() -> str:
    return settings.OPENAI_MODEL or DEFAULT_ENV_MODEL


def env_settings() -> tuple[str, str, str, str]:
    """``(base_url, api_key, model, models_json)`` from the deployment's settings (part of the gateway cache key)."""
    models = json.dumps(settings.OPENAI_MODELS, sort_keys=True) if settings.OPENAI_MODELS else ""
    return (settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, env_model(), models)


def env_default_provider() -> ProviderConfig | None:
    """The implicit ``openai`` provider from ``OPENAI_BASE_URL``/``OPENAI_API_KEY``; None when unset."""
    base_url, api_key, _model, models_json = env_settings()
    if not base_url:
        return None
    models: dict[str, ModelInfo] = {}
    if models_json:
        models = model_table(json.loads(models_json), "OPENAI_MODELS")  # a JSON object: settings checked it at start-up
    return ProviderConfig(name=ENV_PROVIDER, base_url=base_url, api_key=api_key, models=models)


#: The largest answer (a completion, or a whole stream of one) a tenant's provider may send (egress's bound).
MAX_RESPONSE_BYTES = TENANT_ANSWER_BYTES
#: The longest one call to a tenant's provider may take, streamed or not (each read also waits at most the provider's
#: ``timeout``): a server that trickles a byte at a time would otherwise hold a shared worker thread without end.
MAX_CALL_SECONDS = 600.0


def egress_allow() -> list[str]:
    return list(settings.PROVIDER_EGRESS_ALLOW)


def guarded_client_for(provider: Provider, config: ProviderConfig) -> OpenAICompatibleClient | None:
    """The SDK client of a tenant's own OpenAI-compatible provider, on an egress-guarded HTTP client; else None."""
    if provider.tenant_id is None or config.kind != "openai_compatible":
        return None
    client = guarded_client(allow=egress_allow(), timeout=config.timeout, max_response_bytes=MAX_RESPONSE_BYTES,
                            max_exchange_seconds=MAX_CALL_SECONDS)
    return OpenAICompatibleClient(config, http_client=client, show_error_bodies=False)

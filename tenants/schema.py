"""The API key in the OpenAPI schema: drf-spectacular cannot describe :class:`tenants.auth.ApiKeyAuthentication`
by itself (a warning per operation, which ``spectacular --fail-on-warn`` refuses). Registered when config.urls imports
this module."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[misc]
    """``tenants.auth.ApiKeyAuthentication`` as a bearer scheme (Swagger UI's "Authorize")."""

    target_class = "tenants.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "An API key of a tenant: Authorization: Bearer aok_..."}

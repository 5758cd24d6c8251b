"""A typed document's schema where people and clients write it: the API's OpenAPI schema and the admin editor.

Both are made from the document's pydantic model (:mod:`runtime.documents`), so what the editor lists, what the
OpenAPI schema documents and what the service checks cannot drift apart.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe
from drf_spectacular.utils import extend_schema_field
from pydantic import BaseModel
from rest_framework import serializers

from runtime.documents import field_rows, json_schema, openapi_schema


class _EmptyAsNull(serializers.JSONField):
    def to_representation(self, value: Any) -> Any:
        return super().to_representation(value) if value else None


_FIELDS: dict[tuple[type[BaseModel], bool], type[serializers.JSONField]] = {}


def document_field(model: type[BaseModel], *, empty_as_null: bool = False, **kwargs: Any) -> serializers.JSONField:
    """A JSON field documented in OpenAPI with ``model``'s schema (checked by the service, not here).
    ``empty_as_null``: an empty stored document (e.g. an agent version's flow definition) reads as null."""
    if (model, empty_as_null) not in _FIELDS:
        base = _EmptyAsNull if empty_as_null else serializers.JSONField
        cls = type(f"{model.__name__}{'OrNull' if empty_as_null else ''}Field", (base,), {"__doc__": f"A {model.__name__} document."})
        schema = openapi_schema(model)
        _FIELDS[(model, empty_as_null)] = extend_schema_field({**schema, "nullable": True} if empty_as_null else schema)(cls)
    return _FIELDS[(model, empty_as_null)](**kwargs)


class DocumentWidget(forms.Textarea):
    """The admin editor of a document: the JSON, and beside it every field with what it takes and its default."""

    template_name = "admin/widgets/document.html"

    def __init__(self, model: type[BaseModel], attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs={"rows": 16, "cols": 100, "class": "vLargeTextField document-editor", **(attrs or {})})
        self.model = model

    def format_value(self, value: Any) -> str | None:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return value  # what the user typed, shown again with the form's error
        return None if value is None else json.dumps(value, indent=2, ensure_ascii=False)

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        schema = json_schema(self.model)
        context["document"] = {
            "name": self.model.__name__,
            "rows": [{"path": p, "takes": t, "default": json.dumps(d, ensure_ascii=False)} for p, t, d in field_rows(schema)],
            "schema": json.dumps(schema, indent=2, ensure_ascii=False),
        }
        return context

    def render(self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None) -> SafeString:
        # The project's template engine (the form renderer's own engine does not see templates/).
        return mark_safe(render_to_string(self.template_name, self.get_context(name, value, attrs)))  # noqa: S308 (autoescaped template)

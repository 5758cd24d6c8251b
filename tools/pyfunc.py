"""Python functions as tools: an explicit registry and a ``@tool`` decorator.

The JSON Schema for a tool's parameters is generated from the function's type hints and its
Google-style docstring::

    @tool("order_desk.query_order", category="read")
    def query_order(order_id: Annotated[str, Param(pattern=r"^O\\d{12}$", examples=["O202411280001"])],
                    include_items: bool = False) -> dict:
        \"\"\"Look up one order by its id. Use it when the user gives an order number; do not use it
        to search orders by date.

        Args:
            order_id: The order number, as printed on the receipt.
            include_items: Also return the order lines.
        \"\"\"

The registry is frozen after start-up (``registry.freeze()``): later registrations are refused.

Timeouts. The gateway waits ``timeout_seconds`` for a call, then tells the model there was no
result. It cannot stop the function's thread: a function that runs on keeps one of its tool's
bulkhead slots until it returns. A function that may run long checks the call's cancel signal,
set at the timeout (:mod:`tools.cancel`)::

    from tools.cancel import check_cancelled, current_cancel

    @tool("reports.build")
    def build(month: str) -> dict:
        for page in pages(month):
            check_cancelled()            # raises ToolCancelled once the call's time is up
            render(page)
        current_cancel().wait(2.0)       # a sleep that ends early when the call is cancelled

A function that cannot check (a blocking C call, a library that may never return) runs in a
child process instead, killed at the timeout: the tool's config ``{"isolation": "process"}``
(:mod:`tools.isolation`; JSON arguments in, a picklable result out, no database).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import inspect
import json
import re
import threading
import types
import typing
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

__all__ = [
    "Param",
    "PythonTool",
    "PythonToolRegistry",
    "RegistryFrozenError",
    "ToolArgumentError",
    "parse_docstring",
    "registry",
    "schema_for_function",
    "tool",
]

Category = Literal["read", "write"]
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Param:
    """Extra JSON Schema for one parameter, used as ``Annotated[str, Param(...)]``."""

    description: str | None = None
    pattern: str | None = None
    format: str | None = None
    examples: Sequence[Any] | None = None
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    #: Other names the model may use for this field (``x-aliases``; see ``tools.arguments``).
    aliases: Sequence[str] | None = None

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.description:
            out["description"] = self.description
        if self.pattern:
            out["pattern"] = self.pattern
        if self.format:
            out["format"] = self.format
        if self.examples:
            out["examples"] = list(self.examples)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.min_length is not None:
            out["minLength"] = self.min_length
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        if self.aliases:
            out["x-aliases"] = list(self.aliases)
        return out


class RegistryFrozenError(RuntimeError):
    """A registration was attempted after the registry was frozen."""


class ToolArgumentError(TypeError):
    """``call`` got arguments that do not fit the function (missing, unknown, unconvertible)."""


# --------------------------------------------------------------------------- docstrings

_SECTION_RE = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns|Return|Yields|Raises|Examples|Example|Notes|Note|See Also)\s*:\s*$"
)


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a Google-style docstring.

    The description is everything before the first section header (all its paragraphs, joined
    with blank lines kept): it should tell the model when to use the tool and when not to.
    """
    text = inspect.cleandoc(doc or "")
    if not text:
        return "", {}
    lines = text.splitlines()
    description_lines: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    base_indent: int | None = None
    for line in lines:
        header = _SECTION_RE.match(line.strip()) if not line.startswith((" ", "\t")) else None
        if header:
            section = header.group(1)
            current, base_indent = None, None
            continue
        if section is None:
            description_lines.append(line)
            continue
        if section not in ("Args", "Arguments", "Parameters", "Params"):
            continue
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if base_indent is None:
            base_indent = indent
        if indent <= base_indent:
            m = re.match(r"^\s*\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$", line)
            if m:
                current = m.group(1)
                params[current] = m.group(3).strip()
                continue
        if current is not None:
            params[current] = (params[current] + " " + line.strip()).strip()
    description = "\n".join(description_lines).strip()
    description = re.sub(r"\n{3,}", "\n\n", description)
    return description, params


# --------------------------------------------------------------------------- type -> schema


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _json_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, tuple | frozenset | set):
        return list(value)
    return value


def _literal_type(values: Sequence[Any]) -> dict[str, Any]:
    kinds = set()
    for v in values:
        if isinstance(v, bool):
            kinds.add("boolean")
        elif isinstance(v, int):
            kinds.add("integer")
        elif isinstance(v, float):
            kinds.add("number")
        elif isinstance(v, str):
            kinds.add("string")
        elif v is None:
            kinds.add("null")
    if len(kinds) == 1:
        return {"type": kinds.pop()}
    if kinds:
        return {"type": sorted(kinds)}
    return {}


def type_schema(tp: Any) -> dict[str, Any]:
    """JSON Schema for a Python annotation."""
    if tp is inspect.Parameter.empty or tp is Any or tp is object:
        return {}
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *meta = typing.get_args(tp)
        schema = type_schema(base)
        for item in meta:
            if isinstance(item, Param):
                schema.update(item.schema())
            elif isinstance(item, str):
                schema.setdefault("description", item)
            elif isinstance(item, Mapping):
                schema.update(item)
        return schema
    if _is_union(tp):
        args = typing.get_args(tp)
        non_null = [a for a in args if a is not type(None)]
        nullable = len(non_null) != len(args)
        if len(non_null) == 1:
            inner = type_schema(non_null[0])
            if not nullable:
                return inner
            t = inner.get("type")
            if isinstance(t, str) and "anyOf" not in inner:
                inner = {**inner, "type": [t, "null"]}
                if "enum" in inner and None not in inner["enum"]:
                    inner["enum"] = [*inner["enum"], None]
                return inner
            return {"anyOf": [inner, {"type": "null"}]}
        options = [type_schema(a) for a in non_null]
        if nullable:
            options.append({"type": "null"})
        return {"anyOf": options}
    if origin is Literal:
        values = list(typing.get_args(tp))
        return {**_literal_type(values), "enum": [_json_default(v) for v in values]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = [m.value for m in tp]
        return {**_literal_type(values), "enum": values}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if tp is _dt.datetime:
        return {"type": "string", "format": "date-time"}
    if tp is _dt.date:
        return {"type": "string", "format": "date"}
    if tp is _dt.time:
        return {"type": "string", "format": "time"}
    if tp is uuid.UUID:
        return {"type": "string", "format": "uuid"}
    if tp is type(None):
        return {"type": "null"}
    if tp in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset, Sequence, typing.Sequence):
        args = typing.get_args(tp)
        schema: dict[str, Any] = {"type": "array"}
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            schema["prefixItems"] = [type_schema(a) for a in args]
            schema["minItems"] = schema["maxItems"] = len(args)
            return schema
        if args:
            items = type_schema(args[0])
            if items:
                schema["items"] = items
        if origin in (set, frozenset) or tp in (set, frozenset):
            schema["uniqueItems"] = True
        return schema
    if tp is dict or origin in (dict, Mapping, typing.Mapping):
        args = typing.get_args(tp)
        schema = {"type": "object"}
        if len(args) == 2 and type_schema(args[1]):
            schema["additionalProperties"] = type_schema(args[1])
        return schema
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp, include_extras=True)
        props: dict[str, Any] = {}
        required: list[str] = []
        for f in dataclasses.fields(tp):
            props[f.name] = type_schema(hints.get(f.name, Any))
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.append(f.name)
        out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
        if required:
            out["required"] = required
        return out
    if isinstance(tp, type) and typing.is_typeddict(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        required_keys = getattr(tp, "__required_keys__", frozenset(hints))
        out = {
            "type": "object",
            "properties": {k: type_schema(v) for k, v in hints.items()},
            "additionalProperties": False,
        }
        req = [k for k in hints if k in required_keys]
        if req:
            out["required"] = req
        return out
    raise TypeError(f"cannot describe the type {tp!r} in JSON Schema; use a JSON-friendly annotation")


def schema_for_function(func: Callable[..., Any]) -> tuple[dict[str, Any], str]:
    """(parameters JSON Schema, description) for ``func``."""
    description, arg_docs = parse_docstring(func.__doc__)
    sig = inspect.signature(func)
    hints = typing.get_type_hints(func, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in sig.parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"{func.__qualname__}: *args/**kwargs cannot be described to a model; name every parameter")
        prop = type_schema(hints.get(name, param.annotation))
        if name in arg_docs and "description" not in prop:
            prop = {"description": arg_docs[name], **prop}
        if param.default is not inspect.Parameter.empty:
            default = _json_default(param.default)
            try:
                json.dumps(default)
            except (TypeError, ValueError):
                pass
            else:
                prop["default"] = default
        else:
            required.append(name)
        properties[name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema, description


# --------------------------------------------------------------------------- conversion


def _convert(value: Any, tp: Any) -> Any:
    """Turn JSON values into what the annotation asks for (ISO strings -> date/datetime, enums...)."""
    if value is None or tp is inspect.Parameter.empty or tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _convert(value, typing.get_args(tp)[0])
    if _is_union(tp):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        for option in options:
            try:
                converted = _convert(value, option)
            except (TypeError, ValueError):
                continue
            if converted is not value or _matches(value, option):
                return converted
        return value
    if tp is _dt.datetime and isinstance(value, str):
        return _dt.datetime.fromisoformat(value.replace("z", "Z"))
    if tp is _dt.date and isinstance(value, str):
        return _dt.date.fromisoformat(value)
    if tp is _dt.time and isinstance(value, str):
        return _dt.time.fromisoformat(value)
    if tp is uuid.UUID and isinstance(value, str):
        return uuid.UUID(value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum) and not isinstance(value, tp):
        return tp(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, list) and (origin in (list, tuple, set, frozenset, Sequence) or tp in (tuple, set)):
        args = typing.get_args(tp)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            items = [_convert(v, a) for v, a in zip(value, args, strict=False)]
        else:
            items = [_convert(v, args[0]) for v in value] if args else list(value)
        container = origin or tp
        return container(items) if container in (tuple, set, frozenset) else items
    if isinstance(value, dict) and origin in (dict, Mapping):
        args = typing.get_args(tp)
        return {k: _convert(v, args[1]) for k, v in value.items()} if len(args) == 2 else value
    if isinstance(value, dict) and dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp, include_extras=True)
        return tp(**{k: _convert(v, hints.get(k, Any)) for k, v in value.items()})
    return value


def _matches(value: Any, tp: Any) -> bool:
    base = typing.get_origin(tp) or tp
    return isinstance(base, type) and isinstance(value, base)


# --------------------------------------------------------------------------- registry


@dataclass
class PythonTool:
    key: str
    name: str
    func: Callable[..., Any]
    category: Category
    idempotent: bool
    description: str
    schema: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """First paragraph of the description."""
        return self.description.split("\n\n", 1)[0].strip()

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    @property
    def side_effecting(self) -> bool:
        return self.category == "write"

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.schema},
        }

    def convert_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        sig = inspect.signature(self.func)
        hints = typing.get_type_hints(self.func, include_extras=True)
        unknown = [k for k in arguments if k not in sig.parameters]
        if unknown:
            raise ToolArgumentError(
                f"{self.key}: unknown argument(s) {', '.join(unknown)}; expected {', '.join(sig.parameters)}"
            )
        missing = [n for n, p in sig.parameters.items() if p.default is inspect.Parameter.empty and n not in arguments]
        if missing:
            raise ToolArgumentError(f"{self.key}: missing required argument(s) {', '.join(missing)}")
        converted: dict[str, Any] = {}
        for name, value in arguments.items():
            try:
                converted[name] = _convert(value, hints.get(name, sig.parameters[name].annotation))
            except (TypeError, ValueError) as exc:
                raise ToolArgumentError(f"{self.key}: argument {name}: {exc}") from exc
        return converted

    def __call__(self, arguments: Mapping[str, Any]) -> Any:
        kwargs = self.convert_arguments(arguments)
        sig = inspect.signature(self.func)
        positional = [kwargs.pop(n) for n, p in sig.parameters.items() if p.kind is p.POSITIONAL_ONLY and n in kwargs]
        return self.func(*positional, **kwargs)


class PythonToolRegistry:
    """Explicit registry of Python tools, keyed by ``key`` (e.g. ``"order_desk.query_order"``)."""

    def __init__(self) -> None:
        self._tools: dict[str, PythonTool] = {}
        self._frozen = False
        self._lock = threading.Lock()

    # -- registration -----------------------------------------------------------------------

    def register(
        self,
        func: Callable[..., Any],
        *,
        key: str | None = None,
        name: str | None = None,
        category: Category = "read",
        idempotent: bool | None = None,
        description: str | None = None,
        **extra: Any,
    ) -> PythonTool:
        if category not in ("read", "write"):
            raise ValueError(f"category must be 'read' or 'write', not {category!r}")
        key = key or f"{func.__module__.rsplit('.', 1)[-1]}.{func.__name__}"
        name = name or func.__name__
        if not _NAME_RE.match(name):
            raise ValueError(f"tool name {name!r} must match {_NAME_RE.pattern} (OpenAI function-name rules)")
        schema, doc_description = schema_for_function(func)
        entry = PythonTool(
            key=key,
            name=name,
            func=func,
            category=category,
            idempotent=(category == "read") if idempotent is None else idempotent,
            description=(description or doc_description).strip(),
            schema=schema,
            extra=dict(extra),
        )
        with self._lock:
            if self._frozen:
                raise RegistryFrozenError(
                    f"cannot register {key!r}: the Python tool registry is frozen (registrations happen at start-up)"
                )
            existing = self._tools.get(key)
            if existing is not None and existing.func is not func:
                raise ValueError(f"a Python tool with key {key!r} is already registered ({existing.func.__qualname__})")
            self._tools[key] = entry
        return entry

    def tool(
        self,
        key: str | None = None,
        *,
        name: str | None = None,
        category: Category = "read",
        idempotent: bool | None = None,
        description: str | None = None,
        **extra: Any,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register`; returns the function unchanged."""

        def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
            entry = self.register(
                func, key=key, name=name, category=category, idempotent=idempotent, description=description, **extra
            )
            func.__tool__ = entry  # type: ignore[attr-defined]
            return func

        return decorate

    def freeze(self) -> None:
        with self._lock:
            self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    # -- lookup -----------------------------------------------------------------------------

    def get(self, key: str) -> PythonTool:
        try:
            return self._tools[key]
        except KeyError:
            raise KeyError(f"no Python tool registered under {key!r}") from None

    def __contains__(self, key: object) -> bool:
        return key in self._tools

    def __iter__(self) -> Iterator[PythonTool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def keys(self) -> list[str]:
        return list(self._tools)

    def call(self, key: str, arguments: Mapping[str, Any]) -> Any:
        """Call the tool with JSON arguments (ISO strings become date/datetime, values become enums)."""
        return self.get(key)(arguments)


#: The process-wide default registry.
registry = PythonToolRegistry()


def tool(
    key: str | None = None,
    *,
    name: str | None = None,
    category: Category = "read",
    idempotent: bool | None = None,
    description: str | None = None,
    registry: PythonToolRegistry | None = None,
    **extra: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function as a tool in ``registry`` (default: the module-level one).

    The function runs on a thread of the tool gateway, which stops waiting at the tool's
    ``timeout_seconds``. If it may take long, let it stop when the call's time is up: call
    ``tools.cancel.check_cancelled()`` between units of work (it raises ``ToolCancelled``), or
    test ``tools.cancel.cancelled()``, and wait with ``tools.cancel.current_cancel().wait(seconds)``
    rather than ``time.sleep``. Until it returns it holds one of its tool's bulkhead slots. A
    function that cannot check belongs in a child process: tool config ``{"isolation": "process"}``.
    """
    target = registry if registry is not None else globals()["registry"]
    return target.tool(key, name=name, category=category, idempotent=idempotent, description=description, **extra)

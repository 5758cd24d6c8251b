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

Tenants. One function serves every tenant that installed its tool. :func:`current_tenant` is the
id of the tenant whose call is running (in the worker thread or the child process alike; None
outside a call): a function that keeps anything between calls keeps it per tenant, so one tenant
never reads or changes what another's calls left.
"""

from __future__ import annotations

import inspect
import re
import threading
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import typing_extensions
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PydanticSchemaGenerationError,
    PydanticUserError,
    ValidationError,
    create_model,
)
from pydantic.json_schema import PydanticJsonSchemaWarning

__all__ = [
    "Param",
    "PythonTool",
    "PythonToolRegistry",
    "RegistryFrozenError",
    "ToolArgumentError",
    "current_tenant",
    "parse_docstring",
    "registry",
    "schema_for_function",
    "tenant_scope",
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


# --------------------------------------------------------------------------- type hints -> pydantic -> JSON Schema


def _param_extra(meta: Sequence[Any]) -> dict[str, Any]:
    """The JSON Schema a parameter's ``Annotated`` metadata adds: :class:`Param`, a description string, a mapping."""
    extra: dict[str, Any] = {}
    for item in meta:
        if isinstance(item, Param):
            extra.update(item.schema())
        elif isinstance(item, str):
            extra.setdefault("description", item)
        elif isinstance(item, Mapping):
            extra.update(item)
    return extra


_TYPED_DICTS: dict[Any, Any] = {}


def _typed_dict(tp: Any) -> Any:
    """A ``typing.TypedDict`` as ``typing_extensions.TypedDict``: pydantic takes only the latter before Python 3.12."""
    if tp not in _TYPED_DICTS:
        hints = typing.get_type_hints(tp, include_extras=True)
        required = getattr(tp, "__required_keys__", frozenset(hints))
        fields: dict[str, Any] = {}
        for key, hint in hints.items():
            if typing.get_origin(hint) in (typing_extensions.Required, typing_extensions.NotRequired):
                hint = typing.get_args(hint)[0]
            hint = _for_pydantic(hint)
            fields[key] = hint if key in required else typing_extensions.NotRequired[hint]
        converted = typing_extensions.TypedDict(tp.__name__, fields)  # type: ignore[operator]
        converted.__doc__ = tp.__doc__
        _TYPED_DICTS[tp] = converted
    return _TYPED_DICTS[tp]


def _for_pydantic(tp: Any) -> Any:
    """``tp`` with our ``Annotated`` metadata (anywhere in it) turned into pydantic ``Field``s."""
    if isinstance(tp, type) and typing.is_typeddict(tp):
        return _typed_dict(tp)
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *meta = typing.get_args(tp)
        extra = _param_extra(meta)
        kept = [m for m in meta if not isinstance(m, Param | str | Mapping)]
        inner = _for_pydantic(base)
        return Annotated[(inner, *kept, Field(json_schema_extra=extra))] if extra else (
            Annotated[(inner, *kept)] if kept else inner)
    args = typing.get_args(tp)
    if not args or origin is Literal:
        return tp
    rebuilt = tuple(_for_pydantic(a) if a is not Ellipsis else a for a in args)
    if rebuilt == args:
        return tp
    if origin in (typing.Union, types.UnionType):
        return typing.Union[rebuilt]  # noqa: UP007  (rebuilt from a tuple of types)
    try:
        return origin[rebuilt if len(rebuilt) > 1 else rebuilt[0]]
    except TypeError:
        return tp


def _arguments_model(func: Callable[..., Any], arg_docs: Mapping[str, str]) -> type[BaseModel]:
    """A pydantic model of ``func``'s parameters: it makes the JSON Schema and converts the model's arguments."""
    sig = inspect.signature(func)
    hints = typing.get_type_hints(func, include_extras=True)
    fields: dict[str, Any] = {}
    for name, param in sig.parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"{func.__qualname__}: *args/**kwargs cannot be described to a model; name every parameter")
        annotation = hints.get(name, param.annotation)
        annotation = Any if annotation is inspect.Parameter.empty else _for_pydantic(annotation)
        described = typing.get_origin(annotation) is Annotated and any(
            "description" in (getattr(m, "json_schema_extra", None) or {}) for m in typing.get_args(annotation)[1:])
        doc = arg_docs.get(name) if not described else None
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (annotation, Field(default, description=doc))
    config = ConfigDict(extra="forbid", protected_namespaces=(), arbitrary_types_allowed=False)
    try:
        return create_model(f"{func.__name__}_arguments", __config__=config, **fields)
    except (PydanticSchemaGenerationError, PydanticUserError) as exc:
        raise TypeError(f"{func.__qualname__}: cannot describe a parameter's type in JSON Schema; use a JSON-friendly "
                        f"annotation ({exc})") from None


def _compact(node: Any, defs: Mapping[str, Any]) -> Any:
    """pydantic's schema as the model reads it best: references inlined, no titles, ``Optional[X]`` as
    ``{"type": [X, "null"]}``, objects closed (``additionalProperties: false``) as the arguments are."""
    if isinstance(node, list):
        return [_compact(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **siblings}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "properties":
            out[key] = {name: _compact(schema, defs) for name, schema in value.items()}
        else:
            out[key] = _compact(value, defs)
    options = out.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        other = options[0] if options[1] == {"type": "null"} else options[1]
        if isinstance(other.get("type"), str) and not {"anyOf", "oneOf", "allOf"} & set(other):
            merged = {**other, "type": [other["type"], "null"]}
            if "enum" in merged and None not in merged["enum"]:
                merged["enum"] = [*merged["enum"], None]
            out.pop("anyOf")
            out = {**merged, **out}
    if "properties" in out:
        out.setdefault("additionalProperties", False)
    return out


def schema_for_function(func: Callable[..., Any]) -> tuple[dict[str, Any], str]:
    """(parameters JSON Schema, description) for ``func``."""
    description, arg_docs = parse_docstring(func.__doc__)
    model = _arguments_model(func, arg_docs)
    return _schema_of(model), description


def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    with warnings.catch_warnings():  # a default JSON cannot hold is left out of the schema, as it should be
        warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
        raw = model.model_json_schema()
    schema = _compact(raw, raw.get("$defs", {}))
    schema.setdefault("properties", {})
    return schema


def _problem(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ())) or "arguments"
    return f"argument {where}: {error.get('msg', 'invalid')}"


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
    #: The pydantic model of the parameters (made at registration; converts the arguments).
    model: type[BaseModel] | None = None

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
        unknown = [k for k in arguments if k not in sig.parameters]
        if unknown:
            raise ToolArgumentError(
                f"{self.key}: unknown argument(s) {', '.join(unknown)}; expected {', '.join(sig.parameters)}"
            )
        missing = [n for n, p in sig.parameters.items() if p.default is inspect.Parameter.empty and n not in arguments]
        if missing:
            raise ToolArgumentError(f"{self.key}: missing required argument(s) {', '.join(missing)}")
        model = self.model or _arguments_model(self.func, {})
        try:
            validated = model.model_validate(dict(arguments))
        except ValidationError as exc:
            raise ToolArgumentError(f"{self.key}: " + "; ".join(_problem(e) for e in exc.errors())) from exc
        return {name: getattr(validated, name) for name in arguments}

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
        doc_description, arg_docs = parse_docstring(func.__doc__)
        model = _arguments_model(func, arg_docs)
        schema = _schema_of(model)
        entry = PythonTool(
            key=key,
            name=name,
            func=func,
            category=category,
            idempotent=(category == "read") if idempotent is None else idempotent,
            description=(description or doc_description).strip(),
            schema=schema,
            extra=dict(extra),
            model=model,
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

_tenant: ContextVar[int | None] = ContextVar("agentops_tool_tenant", default=None)


def current_tenant() -> int | None:
    """The id of the tenant whose tool call is running; None outside a call (a function's state is kept per tenant)."""
    return _tenant.get()


@contextmanager
def tenant_scope(tenant_id: int | None) -> Iterator[None]:
    """Run the block as a call of ``tenant_id`` (the Python kind's executor and the isolated child do this)."""
    token = _tenant.set(tenant_id)
    try:
        yield
    finally:
        _tenant.reset(token)


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

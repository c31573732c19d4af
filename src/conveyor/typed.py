"""Typed payloads: a handler's type hints, checked at enqueue and rebuilt at run time.

With pydantic installed (the ``pydantic`` extra), each task builds, once at
definition, one pydantic ``TypeAdapter`` over its annotated parameters (and
one over its return type). Then:

- At enqueue, before any I/O, every annotated argument is validated in
  pydantic's *strict* mode: an ``int`` parameter takes an ``int``, never
  ``"5"`` or ``True``; a ``datetime`` takes a ``datetime``. An argument may
  also be given in the JSON form it is stored as (an ISO string for a
  ``datetime``, an object for a dataclass), which is validated in strict
  JSON mode, so a task can be enqueued from JSON (``conveyor enqueue``)
  without loosening the check. A value that fits neither raises
  :class:`~conveyor.errors.PayloadError` naming the argument, the declared
  type and the value given.
- The argument is stored in its JSON form: ISO 8601 strings for
  ``datetime``/``date``/``time``/``timedelta``, strings for ``UUID`` and
  ``Decimal``, an enum's value, objects for dataclasses, typed dicts and
  pydantic models. The strict codec (:mod:`conveyor.payload`) then checks
  the whole payload as before: NaN, NUL, depth and size are refused as ever.
- At run time the stored JSON is validated in pydantic's *lax* mode, which
  parses those strings back, and the handler receives the values as
  declared. A stored payload that no longer fits (the code changed) raises
  PayloadError, which fails the attempt without retry.
- A declared return type is checked and converted the same way when the
  worker stores the result, and rebuilt by the handle's ``result()``.
- A workflow step class is converted and rebuilt the same way (see
  :func:`step_type`).

Handlers whose parameters are all plain scalars (``int``, ``str``...) are
checked by the exact type of each value, without calling pydantic: the
common case costs what it did before.

Parameters that are unannotated, ``Any`` or ``object``, the values taken by
``**kwargs``, and annotations that cannot be resolved (a name imported only
for type checkers) are not checked: they take any JSON value. A parameter
whose type pydantic cannot validate raises ConfigurationError at definition.

Limits: instances of dataclasses and models are taken as built (pydantic
does not validate their fields again); a field whose value does not match
its type is refused when it is converted. Inside a value that is converted
(a model, a dataclass, ``list[Point]``...), parts typed ``Any`` follow
pydantic's JSON rules: a set becomes a list and NaN becomes null there.
Values of plain JSON types (``int``, ``str``, ``list[int]``,
``dict[str, Any]``...) are stored as given, so the codec sees them whole.
On Python 3.11, pydantic needs ``typing_extensions.TypedDict`` rather than
``typing.TypedDict``.

Without pydantic, only the names of the arguments are checked; dataclass
and pydantic-model arguments are converted to objects and rebuilt for the
handler from their annotations, and no other value is converted.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import reprlib
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from conveyor import payload as codec
from conveyor.errors import ConfigurationError, PayloadError
from conveyor.hints import (
    NONE_TYPE,
    declared_types,
    fast_kinds,
    holds_instances,
    json_form,
    json_shaped,
    type_name,
    unchecked,
)

try:
    from pydantic import TypeAdapter, ValidationError
    from pydantic_core import PydanticSerializationError
    from typing_extensions import TypedDict
except ImportError:  # the optional extra is not installed: names only
    TYPES_CHECKED = False
else:
    TYPES_CHECKED = True
    _typed_dict: Any = TypedDict  # called with fields known at run time only

_ANY_VALUE: tuple[type, ...] | None = None
"""The kinds of a parameter that takes any JSON value."""


def _same(one: Any, other: Any) -> bool:
    try:
        return bool(one is other or one == other)
    except Exception:  # an __eq__ that raises
        return False


def _show(value: Any) -> str:
    return f"{type(value).__name__} {reprlib.repr(value)}"


def _explain(exc: Any, expected: Any, given: Any, skip: int = 0) -> str:
    """``expects T, got V`` and pydantic's first complaint, where it is."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"][skip:])
    text = f"expects {type_name(expected)}, got {_show(given)}"
    if where:
        text += f": at {where}, {first['msg']}"
        if not _same(first["input"], given):
            text += f" (got {_show(first['input'])})"
    else:
        text += f" ({first['msg']})"
    if len(errors) > 1:
        text += f", and {len(errors) - 1} more error(s)"
    return text


class ValueType:
    """One declared type (a handler's return type, a workflow step class):
    its values checked strictly and converted to JSON, and rebuilt from it.

    Needs pydantic: build it only when ``TYPES_CHECKED``. Raises
    ConfigurationError if pydantic cannot validate ``annotation``.
    """

    __slots__ = ("_adapter", "_fast", "_shaped", "_warnings", "annotation", "owner")

    def __init__(self, annotation: Any, owner: str, subject: str = "type") -> None:
        self.annotation = annotation
        self.owner = owner
        self._fast = fast_kinds(annotation)
        self._shaped = json_shaped(annotation)
        self._warnings: Any = "error" if holds_instances(annotation) else False
        try:
            self._adapter: Any = TypeAdapter(annotation)
        except Exception as exc:
            reason = re.split(r"\.\s", str(exc).strip())[0] or type(exc).__name__
            raise ConfigurationError(
                f"{owner}: pydantic cannot validate {subject} ({type_name(annotation)}): {reason}"
            ) from exc

    def to_json(self, value: Any, what: str = "value") -> Any:
        """``value`` in its JSON form, checked strictly (see the module
        docstring); raises PayloadError naming ``what``."""
        if type(value) in self._fast:
            return value
        valid = self.validate(value, what)
        if self._shaped:
            return valid
        return self.dump(valid, what)

    def validate(self, value: Any, what: str) -> Any:
        """``value`` validated strictly, or from its JSON form strictly."""
        try:
            return self._adapter.validate_python(value, strict=True)
        except ValidationError as exc:
            error = exc
        text = json_form(value)
        if text is None:  # not a JSON form either: the first complaint stands
            raise PayloadError(f"{what} {_explain(error, self.annotation, value)}") from None
        try:
            return self._adapter.validate_json(text, strict=True)
        except ValidationError as exc:
            raise PayloadError(f"{what} {_explain(exc, self.annotation, value)}") from None

    def dump(self, valid: Any, what: str) -> Any:
        """The JSON form of a validated value."""
        try:
            return self._adapter.serializer.to_python(valid, mode="json", warnings=self._warnings)
        except PydanticSerializationError as exc:
            detail = " ".join(str(exc).split())
            raise PayloadError(f"{what} does not convert to JSON: {detail}") from None

    def from_json(self, value: Any, what: str = "value") -> Any:
        """The declared value rebuilt from its stored JSON form (lax mode);
        raises PayloadError if it no longer fits."""
        if type(value) in self._fast:
            return value
        try:
            return self._adapter.validate_python(value)
        except ValidationError as exc:
            raise PayloadError(f"{what} {_explain(exc, self.annotation, value)}") from None


class ResultType:
    """A handler's result: converted to JSON by the worker, rebuilt by handles."""

    __slots__ = ("_value", "rebuilds")

    def __init__(self, hints: Mapping[str, Any], owner: str) -> None:
        annotation = hints.get("return", Any)
        plain = annotation in (None, NONE_TYPE) or unchecked(annotation)
        self._value = (
            None if plain or not TYPES_CHECKED else ValueType(annotation, owner, "its return type")
        )
        self.rebuilds = self._value is not None
        """Whether a stored result is rebuilt into the declared type."""

    def to_json(self, value: Any) -> Any:
        """The result in its JSON form (PayloadError if it does not fit)."""
        if self._value is None:
            return value
        return self._value.to_json(value, f"the result of {self._value.owner}")

    def from_json(self, value: Any) -> Any:
        """The stored result rebuilt into the declared type."""
        if self._value is None:
            return value
        return self._value.from_json(value, f"the stored result of {self._value.owner}")


class PayloadTypes:
    """The declared types of a handler's payload parameters (see the module
    docstring). ``to_json`` at enqueue, ``from_json`` at run time; both take
    a payload whose names were checked already.

    ``hints`` are the handler's resolved annotations, ``names`` the
    parameters that come from the payload (not the context, not
    ``**kwargs``). Raises ConfigurationError if pydantic cannot validate a
    parameter's type.
    """

    __slots__ = (
        "_adapter",
        "_all_converted",
        "_converted",
        "_dump",
        "_fast",
        "_fields",
        "_json_first",
        "_singles",
        "_validate_strictly",
        "_warnings",
        "owner",
    )

    def __init__(self, owner: str, hints: Mapping[str, Any], names: Iterable[str]) -> None:
        self.owner = owner
        names = list(names)
        checked = {
            name: hints[name] for name in names if name in hints and not unchecked(hints[name])
        }
        self._fields = checked
        self._fast: dict[str, tuple[type, ...]] = {
            name: fast_kinds(annotation) for name, annotation in checked.items()
        }
        self._converted = frozenset(
            name for name, annotation in checked.items() if not json_shaped(annotation)
        )
        self._all_converted = len(self._converted) == len(checked)
        holds = any(holds_instances(checked[name]) for name in self._converted)
        self._warnings: Any = "error" if holds else False
        self._singles: dict[str, ValueType] = {}
        self._json_first = False
        self._adapter: Any = self._build(checked) if checked and TYPES_CHECKED else None
        if self._adapter is not None:  # the core's own methods: no wrapper per call
            self._validate_strictly = self._adapter.validator.validate_python
            self._dump = self._adapter.serializer.to_python

    def _build(self, fields: dict[str, Any]) -> Any:
        shape = _typed_dict("payload", fields, total=False)
        try:
            return TypeAdapter(shape)
        except Exception as exc:
            for name, annotation in fields.items():  # find which one
                ValueType(annotation, self.owner, f"parameter {name!r}")
            raise ConfigurationError(
                f"{self.owner}: pydantic cannot validate its parameters: {exc}"
            ) from exc

    @property
    def checked(self) -> bool:
        """Whether any argument's type is checked (pydantic installed and some
        parameter annotated)."""
        return self._adapter is not None

    def to_json(self, args: dict[str, Any]) -> dict[str, Any]:
        """The payload with every checked argument validated strictly and in
        its JSON form; ``args`` itself when nothing needs converting. Raises
        PayloadError naming the argument, its type and the value given."""
        if self._adapter is None:
            return args
        fast = self._fast
        for name, value in args.items():
            kinds = fast.get(name, _ANY_VALUE)
            if kinds is not None and type(value) not in kinds:
                return self._convert(args)
        return args

    def _convert(self, args: dict[str, Any]) -> dict[str, Any]:
        # The adapter's TypedDict ignores the keys it does not name: the
        # unchecked arguments pass through as given.
        valid = self._validate(args)
        if not self._converted:
            return {**args, **valid}
        include = None if self._all_converted else self._converted
        try:
            plain = self._dump(valid, mode="json", include=include, warnings=self._warnings)
        except PydanticSerializationError:
            for name in self._converted.intersection(valid):  # which one? say so
                try:
                    self._single(name).dump(valid[name], f"argument {name!r}")
                except PayloadError as exc:
                    raise PayloadError(f"payload does not fit {self.owner}: {exc}") from None
            raise
        if self._all_converted:
            return {**args, **plain}
        return {**args, **valid, **plain}

    def _single(self, name: str) -> ValueType:
        """The type of one parameter alone (built when first needed)."""
        found = self._singles.get(name)
        if found is None:
            found = self._singles[name] = ValueType(self._fields[name], self.owner)
        return found

    def _validate(self, part: dict[str, Any]) -> dict[str, Any]:
        """Strictly; an argument refused as given is tried in its JSON form.

        Payloads given wholly in JSON form (from a CLI, an HTTP body) come in
        runs: after one, the next is tried as JSON first, which spares the
        cost of a refusal per payload."""
        if self._json_first:
            found = self._validate_json_form(part)
            if found is not None:
                return found
            self._json_first = False
        try:
            valid: dict[str, Any] = self._validate_strictly(part, strict=True)
            return valid
        except ValidationError as exc:
            error = exc
        found = self._validate_json_form(part)
        if found is not None:
            self._json_first = True
            return found
        failed = {str(err["loc"][0]) for err in error.errors(include_url=False) if err["loc"]}
        retried = dict(part)
        for name in failed:
            try:
                retried[name] = self._single(name).validate(part[name], f"argument {name!r}")
            except PayloadError as exc:
                raise PayloadError(f"payload does not fit {self.owner}: {exc}") from None
        try:
            valid = self._adapter.validate_python(retried, strict=True)
        except ValidationError as exc:  # a constraint across arguments, if any
            raise PayloadError(f"payload does not fit {self.owner}: {exc}") from None
        return valid

    def _validate_json_form(self, part: dict[str, Any]) -> dict[str, Any] | None:
        """``part`` validated in strict JSON mode, if it is made of JSON types
        and fits; else None."""
        text = json_form(part)
        if text is None:
            return None
        try:
            valid: dict[str, Any] = self._adapter.validate_json(text, strict=True)
        except ValidationError:
            return None
        return valid

    def from_json(self, args: dict[str, Any]) -> dict[str, Any]:
        """The handler's arguments rebuilt from the stored payload (lax mode:
        ISO strings become datetimes, objects dataclasses...); ``args``
        itself when nothing needs rebuilding. Raises PayloadError naming the
        argument if the stored payload no longer fits."""
        if self._adapter is None:
            return args
        fast = self._fast
        for name, value in args.items():
            kinds = fast.get(name, _ANY_VALUE)
            if kinds is not None and type(value) not in kinds:
                break
        else:
            return args
        try:
            valid = self._adapter.validate_python(args)
        except ValidationError as exc:
            name = str(exc.errors(include_url=False)[0]["loc"][0])
            detail = _explain(exc, self._fields[name], args.get(name), skip=1)
            raise PayloadError(
                f"the stored payload does not fit {self.owner}: argument {name!r} {detail}"
            ) from None
        return {**args, **valid}


class PlainPayload:
    """Without pydantic: arguments are not type-checked; dataclass and
    pydantic-model arguments are rebuilt from their annotations at run time."""

    __slots__ = ("_hints",)

    checked = False

    def __init__(self, hints: Mapping[str, Any]) -> None:
        self._hints = {
            name: hint
            for name, hint in hints.items()
            if isinstance(hint, type)
            and (dataclasses.is_dataclass(hint) or callable(getattr(hint, "model_validate", None)))
        }

    def to_json(self, args: dict[str, Any]) -> dict[str, Any]:
        """``args`` as given (the codec converts dataclasses and models)."""
        return args

    def from_json(self, args: dict[str, Any]) -> dict[str, Any]:
        """Dataclass and model arguments rebuilt from their objects."""
        if not self._hints:
            return args
        return {key: _rebuild(self._hints.get(key), value) for key, value in args.items()}


def payload_types(
    owner: str, hints: Mapping[str, Any], names: Iterable[str]
) -> PayloadTypes | PlainPayload:
    """The payload types of a handler: checked with pydantic, else names only."""
    if TYPES_CHECKED:
        return PayloadTypes(owner, hints, names)
    return PlainPayload(hints)


class BareHandler:
    """A handler's types read from the handler alone, for a process child
    whose import found the bare function rather than its task definition
    (``app.task(process=True)(module.fn)``): it rebuilds the arguments and
    converts the result as the definition does."""

    __slots__ = ("_payload", "_result", "fn")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        hints = declared_types(fn)
        keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        names = [p.name for p in inspect.signature(fn).parameters.values() if p.kind in keyword]
        owner = f"handler {fn.__qualname__!r}"
        self._payload = payload_types(owner, hints, names)
        self._result = ResultType(hints, owner)

    def build_kwargs(self, args: dict[str, Any], ctx: object) -> dict[str, Any]:
        """The handler's arguments rebuilt from the stored payload."""
        return self._payload.from_json(args)

    def encode_result(self, value: Any, max_bytes: int) -> str:
        """The handler's result as stored (see ``TaskDef.encode_result``)."""
        return codec.encode(self._result.to_json(value), max_bytes)


def _rebuild(annotation: Any, value: Any) -> Any:
    if annotation is None or not isinstance(value, dict):
        return value
    validate = getattr(annotation, "model_validate", None)
    if callable(validate):
        return validate(value)
    return annotation(**value)


_step_types: weakref.WeakKeyDictionary[type, ValueType | None] = weakref.WeakKeyDictionary()


def step_type(cls: type) -> ValueType | None:
    """The value type of a workflow step class (built once per class); None
    without pydantic, or for a class pydantic cannot validate (a field whose
    annotation does not resolve): such a step keeps the pydantic-free
    conversion, so a workflow already stored still runs."""
    if not TYPES_CHECKED:
        return None
    try:
        return _step_types[cls]
    except KeyError:
        pass
    try:
        found: ValueType | None = ValueType(cls, f"step {cls.__qualname__}")
    except ConfigurationError:
        found = None
    _step_types[cls] = found
    return found

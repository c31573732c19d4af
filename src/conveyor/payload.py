"""The strict JSON codec for payloads, results and messages.

Guarantees: what ``encode`` accepts, every backend stores and ``decode``
returns unchanged. It rejects, with :class:`~conveyor.errors.PayloadError`
and before any I/O: NaN and ±Infinity, the NUL character (PostgreSQL's jsonb
cannot hold it), lone surrogates (not valid UTF-8), non-string object keys,
values that are not JSON types, nesting deeper than ``MAX_DEPTH``; and with
:class:`~conveyor.errors.PayloadTooLargeError` an encoding larger than the cap.

Dataclass instances and pydantic models are converted to plain JSON first.
Values typed by a handler's hints (datetimes, UUIDs, enums...) are converted
by :mod:`conveyor.typed` before they reach the codec, which then checks the
converted payload whole: the conversion never lets through what the codec
refuses.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from conveyor.errors import PayloadError, PayloadTooLargeError

MAX_DEPTH = 64

_encoder = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


_PLAIN = frozenset({str, int, float, bool, type(None), dict, list})
"""Types that are plain JSON already (exact types: subclasses take the long way)."""
_SCALARS = frozenset({int, float, bool, type(None)})


def to_plain(value: Any) -> Any:
    """Turn dataclass instances and pydantic models into plain JSON values.

    A conversion that fails (a field that cannot be copied, a ``model_dump``
    that raises) raises :class:`~conveyor.errors.PayloadError`.
    """
    if type(value) in _PLAIN:
        return value
    try:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.asdict(value)
        model_dump = getattr(value, "model_dump", None)
        if callable(model_dump) and not isinstance(value, type):
            return model_dump(mode="json")
    except Exception as exc:
        raise PayloadError(f"{type(value).__name__} does not convert to JSON: {exc}") from exc
    return value


def _check_string(value: str) -> None:
    if "\x00" in value:
        raise PayloadError("strings must not contain the NUL character")


class _Budget:
    """Characters of strings (and entries of containers) a value may still
    hold before its encoding is surely over the cap: the walk that checks a
    value stops there, so an oversized value costs what the cap allows, not
    what it holds."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.left = limit if limit is not None else -1

    def spend(self, amount: int) -> None:
        if self.limit is not None:
            self.left -= amount
            if self.left < 0:
                raise PayloadTooLargeError(self.limit - self.left, self.limit, at_least=True)


def _check(value: Any, depth: int, budget: _Budget) -> None:
    if depth > MAX_DEPTH:
        raise PayloadError(f"nesting is deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind is str:
        budget.spend(len(value))
        _check_string(value)
        return
    if kind in _SCALARS:
        return  # NaN/Infinity are caught by the encoder (allow_nan=False)
    if kind is dict:  # the common case, without the generic checks below
        if value and depth >= MAX_DEPTH:
            raise PayloadError(f"nesting is deeper than {MAX_DEPTH} levels")
        size = len(value)
        for key, item in value.items():
            if type(key) is not str:
                raise PayloadError(f"object keys must be strings, not {type(key).__name__}")
            size += len(key)
            _check_string(key)
            if type(item) not in _SCALARS:
                _check(item, depth + 1, budget)
        budget.spend(size)
        return
    _check_other(value, depth, budget)


def _check_other(value: Any, depth: int, budget: _Budget) -> None:
    if isinstance(value, str):
        budget.spend(len(value))
        _check_string(value)
        return
    if value is None or isinstance(value, bool | int | float):
        return
    if isinstance(value, Mapping):
        budget.spend(len(value))
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(f"object keys must be strings, not {type(key).__name__}")
            _check(key, depth + 1, budget)
            _check(item, depth + 1, budget)
        return
    if isinstance(value, list | tuple):
        budget.spend(len(value))
        for item in value:
            _check(item, depth + 1, budget)
        return
    raise PayloadError(f"{type(value).__name__} is not a JSON type")


def encode(value: Any, max_bytes: int | None = None) -> str:
    """Encode ``value`` as compact strict JSON text, enforcing the size cap."""
    if value is None and (max_bytes is None or max_bytes >= len("null")):
        return "null"
    value = to_plain(value)
    if isinstance(value, Mapping) and not (
        type(value) is dict and all(type(item) in _PLAIN for item in value.values())
    ):
        value = {key: to_plain(item) for key, item in value.items()}
    _check(value, 0, _Budget(max_bytes))
    try:
        text = _encoder.encode(value)
    except ValueError as exc:  # NaN or Infinity
        raise PayloadError(f"not strict JSON: {exc}") from None
    if text.isascii():  # one byte per character, and no surrogate
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise PayloadError("strings must be valid Unicode (lone surrogate found)") from None
    if max_bytes is not None and size > max_bytes:
        raise PayloadTooLargeError(size, max_bytes)
    return text


def _reject_constant(name: str) -> Any:
    raise PayloadError(f"{name} is not strict JSON")


_decoder = json.JSONDecoder(parse_constant=_reject_constant)


def decode(text: str | bytes) -> Any:
    """Decode stored JSON; a corrupt document raises :class:`PayloadError`
    (nesting too deep for Python's decoder included)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return _decoder.decode(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise PayloadError(f"stored JSON does not decode: {exc}") from None


def decode_for_display(text: str | bytes) -> Any:
    """Decode stored JSON; a corrupt document (written around conveyor) is
    returned as its text instead, so the task that holds it stays readable."""
    try:
        return decode(text)
    except PayloadError:
        if isinstance(text, bytes):
            return text.decode("utf-8", "backslashreplace")
        return text

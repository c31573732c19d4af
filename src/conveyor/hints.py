"""What a type hint says, read without pydantic: its resolved form, a
readable name, the exact types whose values fit it as they are, whether its
values are their own JSON form, and whether they may hold dataclass or model
instances. :mod:`conveyor.typed` checks and converts payloads by these."""

from __future__ import annotations

import contextlib
import enum
import json
import types
import typing
from collections.abc import Callable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal, NoReturn, Union
from uuid import UUID

NONE_TYPE = type(None)
SCALARS: dict[Any, tuple[type, ...]] = {
    int: (int,),
    float: (float,),
    str: (str,),
    bool: (bool,),
    None: (NONE_TYPE,),
    NONE_TYPE: (NONE_TYPE,),
    dict: (dict,),
    list: (list,),
    dict[str, Any]: (dict,),
    list[Any]: (list,),
}
"""Annotations that a value of one of these exact types fits as it is (its
JSON form is itself): the fast path, with no call into pydantic."""


def declared_types(fn: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of ``fn`` (``Annotated`` kept), one by one:
    an annotation that does not resolve is left out, the others kept."""
    with contextlib.suppress(Exception):
        return typing.get_type_hints(fn, include_extras=True)
    found: dict[str, Any] = {}
    scope = getattr(fn, "__globals__", {})
    for name, annotation in getattr(fn, "__annotations__", {}).items():
        probe = types.SimpleNamespace(__annotations__={name: annotation}, __globals__=scope)
        with contextlib.suppress(Exception):  # this one does not resolve: left out
            found.update(typing.get_type_hints(probe, include_extras=True))
    return found


def type_name(annotation: Any) -> str:
    """A short, readable name of a type (``int``, ``list[Point]``, ``int | None``)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(member) for member in args)
    if origin is Literal:
        return f"Literal[{', '.join(repr(member) for member in args)}]"
    if origin is Annotated:
        return type_name(args[0])
    if origin is not None and args:
        return f"{type_name(origin)}[{', '.join(type_name(member) for member in args)}]"
    if annotation is None or annotation is NONE_TYPE:
        return "None"
    if annotation is Any:
        return "Any"
    if isinstance(annotation, type):
        return annotation.__qualname__
    return repr(annotation)


def unchecked(annotation: Any) -> bool:
    return annotation is Any or annotation is object or annotation is NoReturn


def fast_kinds(annotation: Any) -> tuple[type, ...]:
    """The exact types whose values fit ``annotation`` as they are; empty if
    every value needs the adapter."""
    try:
        found = SCALARS.get(annotation)
    except TypeError:  # an unhashable annotation
        return ()
    if found is not None:
        return found
    if typing.get_origin(annotation) in (Union, types.UnionType):
        kinds: list[type] = []
        for member in typing.get_args(annotation):
            member_kinds = fast_kinds(member)
            if not member_kinds:
                return ()
            kinds.extend(member_kinds)
        return tuple(kinds)
    return ()


def json_shaped(annotation: Any) -> bool:
    """Whether a valid value of ``annotation`` is its own JSON form: made of
    JSON scalars, ``list``, ``dict`` with string keys, unions and literals of
    those. Such values are stored as validated, without conversion."""
    if annotation in (int, float, str, bool, None, NONE_TYPE, dict, list) or unchecked(annotation):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        return all(json_shaped(member) for member in args)
    if origin is Annotated:
        return json_shaped(args[0])
    if origin is Literal:
        return all(isinstance(member, str | int | bool) or member is None for member in args)
    if origin is list:
        return all(json_shaped(member) for member in args)
    if origin is dict:
        return len(args) == 2 and args[0] is str and json_shaped(args[1])
    return False


JSON_TYPES = (str, int, float, bool, NONE_TYPE, list, dict)


def json_form(value: Any) -> str | None:
    """``value`` as JSON text if it is made of JSON types only, else None."""
    if type(value) not in JSON_TYPES:
        return None
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


LEAVES = (datetime, date, time, timedelta, UUID, Decimal, enum.Enum, bytes, str, int, float)


def holds_instances(annotation: Any) -> bool:
    """Whether a validated value of ``annotation`` may hold a dataclass or
    model instance, whose fields pydantic does not validate again: its
    conversion must then refuse a field that does not match its type. False
    only for what is made of leaves (datetimes, UUIDs, enums...) and the
    usual containers of them."""
    if annotation is None or annotation is NONE_TYPE or unchecked(annotation):
        return False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return False
    if origin is Annotated:
        return holds_instances(args[0])
    if origin in (Union, types.UnionType, list, tuple, set, frozenset, dict):
        return any(member is not Ellipsis and holds_instances(member) for member in args)
    return not (isinstance(annotation, type) and issubclass(annotation, LEAVES))

"""Typed values that cross a process boundary inside a payload and arrive as the same type.

A payload's data tree is msgpack (see :mod:`omnictl.transports.packing`). Plain msgpack
turns a struct into a dict on the way, which is how output conventions used to degrade
into string keys agreed in docstrings. A :class:`WireStruct` subclass is written with its
class name and its fields in order, and rebuilt as that class on arrival; its array and
tensor fields still travel as raw buffers, never through msgpack or pickle.

Only subclasses of :class:`WireStruct` are rebuilt, and only those whose module is
importable in the receiving process: a payload names a class, it never carries code.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

import msgspec

from omnictl.exceptions import UnknownWireType


class WireStruct(msgspec.Struct, kw_only=True):
    """Base class of structs that keep their type across processes (see module docstring)."""

    _registry: ClassVar[dict[str, type[WireStruct]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        WireStruct._registry[wire_name(cls)] = cls


def wire_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def wire_fields(obj: WireStruct) -> list[Any]:
    """``[type name, field values...]``: what a struct is written as."""
    return [wire_name(type(obj)), *msgspec.structs.astuple(obj)]


def rebuild(values: list[Any]) -> WireStruct:
    """The struct that :func:`wire_fields` wrote (its constructor re-checks the fields)."""
    name, *fields = values
    cls = WireStruct._registry.get(name)
    if cls is None:
        module = str(name).partition(":")[0]
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UnknownWireType(
                f"payload holds a {name!r}, and module {module!r} cannot be imported here: {exc}"
            ) from exc
        cls = WireStruct._registry.get(name)
        if cls is None:
            raise UnknownWireType(f"payload holds a {name!r}, which is not a WireStruct in module {module!r}")
    names = cls.__struct_fields__
    return cls(**dict(zip(names, fields)))

"""Pack a payload's data tree into (skeleton, layout table, tensor bytes) and back.

Tensor and numpy leaves are replaced in the skeleton by a marker holding their index in
the layout table; their bytes are laid out back to back in one buffer. Everything else
is msgpack; a :class:`~omnictl.wire.WireStruct` keeps its type (written as its class name and
fields). Nothing else travels: any other object fails its request with an error naming
the field path and the Python type, unless the topology opts in with ``allow_pickle: true``
(trusted hosts only: unpickling runs code). GPU tensors on a ``cuda_ipc`` edge travel as
torch's own CUDA IPC handles (``device_leaf``), between processes on one GPU.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any, Callable

import msgspec
import numpy as np

from omnictl.exceptions import UnsupportedPayload
from omnictl.messages import TensorLayout
from omnictl.wire import WireStruct, rebuild, wire_fields

_TENSOR_EXT = 1
_PICKLE_EXT = 2
_STRUCT_EXT = 3
_DEVICE_EXT = 4  # a CUDA IPC handle (torch's reduction), only from a cuda_ipc codec
_ALIGN = 64  # keep every tensor cache-line aligned inside the buffer


def _torch() -> Any:
    """torch if this process already imported it; no tensor can exist otherwise."""
    return sys.modules.get("torch")


def is_tensor(obj: Any) -> bool:
    if isinstance(obj, np.ndarray):
        return True
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def _as_bytes_view(obj: Any) -> tuple[str, str, tuple[int, ...], memoryview]:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return "numpy", arr.dtype.str, tuple(arr.shape), arr.reshape(-1).view(np.uint8).data
    torch = _torch()
    t = obj.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    flat = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return "torch", str(t.dtype).removeprefix("torch."), tuple(t.shape), memoryview(flat.numpy())


class PackedTree:
    """The result of :func:`pack`: write ``views`` at their offsets into a buffer."""

    __slots__ = ("skeleton", "layout", "views", "nbytes")

    def __init__(self, skeleton: bytes, layout: tuple[TensorLayout, ...], views: list[memoryview], nbytes: int) -> None:
        self.skeleton = skeleton
        self.layout = layout
        self.views = views
        self.nbytes = nbytes

    def write_into(self, buffer: memoryview) -> None:
        for entry, view in zip(self.layout, self.views):
            buffer[entry.offset : entry.offset + entry.nbytes] = view

    def to_bytes(self) -> bytes:
        out = bytearray(self.nbytes)
        self.write_into(memoryview(out))
        return bytes(out)


def pack(data: Any, device_leaf: Callable[[Any], bytes] | None = None, allow_pickle: bool = False) -> PackedTree:
    """``device_leaf``, when given, serializes tensors that live on a GPU (CUDA IPC
    handles) instead of copying their bytes to the host. An object outside the typed
    encoding raises :class:`UnsupportedPayload` naming its path and type, unless
    ``allow_pickle``."""
    packer = _Packer(data, device_leaf, allow_pickle)
    # msgspec encodes tuples and sets natively as arrays: they come back as lists.
    skeleton = msgspec.msgpack.Encoder(enc_hook=packer.enc_hook).encode(_mark_structs(data))
    return PackedTree(skeleton, tuple(packer.layout), packer.views, packer.offset)


class _Packer:
    """One :func:`pack` call's state. A class, not a closure: a nested hook that names
    itself (for structs) is a reference cycle, which would keep the payload's tensors
    alive until the garbage collector runs (and with them a leased shm slot)."""

    __slots__ = ("data", "device_leaf", "allow_pickle", "layout", "views", "offset")

    def __init__(self, data: Any, device_leaf: Callable[[Any], bytes] | None, allow_pickle: bool) -> None:
        self.data = data
        self.device_leaf = device_leaf
        self.allow_pickle = allow_pickle
        self.layout: list[TensorLayout] = []
        self.views: list[memoryview] = []
        self.offset = 0

    def enc_hook(self, obj: Any) -> Any:
        if self.device_leaf is not None and getattr(obj, "is_cuda", False):
            return msgspec.msgpack.Ext(_DEVICE_EXT, self.device_leaf(obj))
        if is_tensor(obj):
            kind, dtype, shape, view = _as_bytes_view(obj)
            index = len(self.layout)
            self.layout.append(TensorLayout(index, kind, dtype, shape, self.offset, view.nbytes))
            self.views.append(view)
            self.offset += -(-view.nbytes // _ALIGN) * _ALIGN
            return msgspec.msgpack.Ext(_TENSOR_EXT, index.to_bytes(4, "little"))
        if isinstance(obj, _Typed):
            # its own encoder: msgspec encoders are not re-entrant; its tensors share this layout
            fields = [_mark_structs(value) for value in wire_fields(obj.struct)]
            return msgspec.msgpack.Ext(_STRUCT_EXT, msgspec.msgpack.Encoder(enc_hook=self.enc_hook).encode(fields))
        if isinstance(obj, np.generic):  # a numpy scalar is a number
            return obj.item()
        if self.allow_pickle:
            return msgspec.msgpack.Ext(_PICKLE_EXT, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        path = _path_to(self.data, obj, "") or "(unknown path)"
        cls = type(obj)
        raise UnsupportedPayload(
            f"{path}: a {cls.__module__}.{cls.__qualname__} cannot travel between processes; send "
            "tensors, arrays, bytes, str, numbers, bools, None, lists, dicts or typed outputs "
            "(or set `allow_pickle: true` in the topology, for trusted hosts only)",
            path=path,
            type_name=f"{cls.__module__}.{cls.__qualname__}",
        )


def _path_to(data: Any, target: Any, path: str) -> str | None:
    """Where ``target`` sits in ``data`` (``["audio"][2].samples``), found by identity."""
    if data is target:
        return path or "(the payload itself)"
    if isinstance(data, dict):
        items: Any = ((f"{path}[{key!r}]", value) for key, value in data.items())
    elif isinstance(data, (list, tuple, set, frozenset)):
        items = ((f"{path}[{i}]", value) for i, value in enumerate(data))
    elif isinstance(data, WireStruct):
        items = ((f"{path}.{name}", getattr(data, name)) for name in data.__struct_fields__)
    else:
        return None
    for where, value in items:
        found = _path_to(value, target, where)
        if found is not None:
            return found
    return None


class _Typed:
    """Wraps a WireStruct so that msgspec hands it to ``enc_hook`` (it would write a
    struct as a plain map otherwise, losing its type)."""

    __slots__ = ("struct",)

    def __init__(self, struct: WireStruct) -> None:
        self.struct = struct


_LEAF_TYPES = frozenset({str, int, float, bool, bytes, type(None)})


def _mark_structs(data: Any) -> Any:
    """``data`` with every WireStruct wrapped; containers are copied only when one holds one.

    The common case, a container of plain values, is recognised by the set of its values'
    types (a C-level pass) and returned as it is: walking a payload element by element in
    Python cost more than encoding it (4 µs for a dict with 8 token ids)."""
    if isinstance(data, WireStruct):
        return _Typed(data)
    if isinstance(data, dict):
        if set(map(type, data.values())) <= _LEAF_TYPES:
            return data
        marked = {key: _mark_structs(value) for key, value in data.items()}
        return marked if any(marked[key] is not value for key, value in data.items()) else data
    if isinstance(data, (list, tuple)):
        if set(map(type, data)) <= _LEAF_TYPES:
            return data
        items = [_mark_structs(value) for value in data]
        return items if any(new is not old for new, old in zip(items, data)) else data
    return data


def unpack(
    skeleton: bytes,
    layout: tuple[TensorLayout, ...],
    buffer: Any,
    allow_pickle: bool = False,
    *,
    views: bool = False,
    base: int = 0,
) -> Any:
    """Rebuild the data tree; tensors are copied out of ``buffer`` (so it can be reused),
    or, with ``views``, are views of ``buffer`` at ``base + offset`` (no copy: every
    tensor then holds a reference to ``buffer``, the exporter whose death frees the
    bytes, see :mod:`omnictl.transports.leases`). A pickled leaf is refused unless
    ``allow_pickle`` (the topology's opt-in)."""
    if views:
        leaves = [_view(entry, buffer, base + entry.offset) for entry in layout]
    else:
        leaves = [_rebuild(entry, buffer) for entry in layout]
    return msgspec.msgpack.decode(skeleton, ext_hook=_Unpacker(leaves, allow_pickle).ext_hook)


def unpack_frames(
    skeleton: bytes, layout: tuple[TensorLayout, ...], frames: list[memoryview], allow_pickle: bool = False
) -> Any:
    """Rebuild the data tree from one buffer per tensor (ZeroMQ frames, each owned by its
    message alone): the tensors are views of the frames, not copies."""
    if len(frames) != len(layout):
        raise ValueError(f"the payload lists {len(layout)} tensor(s) but {len(frames)} frame(s) came with it")
    for entry, frame in zip(layout, frames):
        if len(frame) != entry.nbytes:
            raise ValueError(f"tensor {entry.index} is {entry.nbytes} bytes but its frame has {len(frame)}")
    leaves = [_view(entry, frame, 0) for entry, frame in zip(layout, frames)]
    return msgspec.msgpack.decode(skeleton, ext_hook=_Unpacker(leaves, allow_pickle).ext_hook)


class _Unpacker:
    """One :func:`unpack` call's state; a class for the reason given at :class:`_Packer`
    (here the cycle would hold the received tensors, views of a leased slot)."""

    __slots__ = ("leaves", "allow_pickle")

    def __init__(self, leaves: list[Any], allow_pickle: bool) -> None:
        self.leaves = leaves
        self.allow_pickle = allow_pickle

    def ext_hook(self, code: int, raw: memoryview) -> Any:
        if code == _TENSOR_EXT:
            return self.leaves[int.from_bytes(raw, "little")]
        if code == _STRUCT_EXT:
            return rebuild(msgspec.msgpack.decode(raw, ext_hook=self.ext_hook))
        if code == _DEVICE_EXT:
            return pickle.loads(raw)  # torch's CUDA IPC handle: sent by a cuda_ipc codec only
        if code == _PICKLE_EXT:
            if not self.allow_pickle:
                raise UnsupportedPayload(
                    "a payload holds a pickled object and this topology does not set `allow_pickle: true`",
                    path="(payload)",
                    type_name="pickle",
                )
            return pickle.loads(raw)
        raise ValueError(f"unknown payload extension code {code}")


def _rebuild(entry: TensorLayout, buffer: memoryview | bytes) -> Any:
    raw = memoryview(buffer)[entry.offset : entry.offset + entry.nbytes]
    if entry.kind == "numpy":
        return np.frombuffer(raw, dtype=np.dtype(entry.dtype)).reshape(entry.shape).copy()
    import torch  # a torch leaf was sent, so the receiver needs torch anyway

    dtype = getattr(torch, entry.dtype)
    if entry.nbytes == 0:
        return torch.empty(entry.shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return flat.view(dtype).reshape(entry.shape)


def _view(entry: TensorLayout, exporter: Any, offset: int) -> Any:
    """A tensor over ``exporter``'s bytes from ``offset``: numpy and torch both keep
    ``exporter`` itself alive (through the buffer they hold), not just the memory, so its
    finalizer runs only once the last tensor, view or slice of it is gone."""
    if entry.kind == "numpy":
        dtype = np.dtype(entry.dtype)
        if entry.nbytes == 0:
            return np.empty(entry.shape, dtype=dtype)
        return np.frombuffer(exporter, dtype=dtype, count=entry.nbytes // dtype.itemsize, offset=offset).reshape(
            entry.shape
        )
    import torch

    dtype = getattr(torch, entry.dtype)
    if entry.nbytes == 0:
        return torch.empty(entry.shape, dtype=dtype)
    count = entry.nbytes // dtype.itemsize
    return torch.frombuffer(exporter, dtype=dtype, count=count, offset=offset).reshape(entry.shape)


def copy_containers(data: Any) -> Any:
    """A copy of every dict/list/tuple in the tree; leaves (tensors included) are shared.

    Fan-out by direct pass gives each downstream its own containers, so one downstream
    mutating what it received never changes what another sees.
    """
    if isinstance(data, dict):
        return {k: copy_containers(v) for k, v in data.items()}
    if isinstance(data, list):
        return [copy_containers(v) for v in data]
    if isinstance(data, tuple):
        return tuple(copy_containers(v) for v in data)
    return data

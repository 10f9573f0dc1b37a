"""The kinds of edge transport and their tuning: what a topology names, what transports implement.

Here, not in :mod:`omnictl.topology.model` (which re-exports both), so that the transports
never import the topology, not even for a type: the topology derives each edge's transport
from the registry (:mod:`omnictl.transports.registry`), and an
:class:`~omnictl.transports.endpoint.Endpoint` is handed the plain data it reads of a
topology, a :class:`WireLayout` (``Topology.wire_layout()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping


class Transport:
    """A kind of edge transport, by name: one object per name, so kinds compare with ``is``.

    The built-in kinds are attributes (``Transport.SHM``); a plug-in adds its own
    (``Transport("mine")``). What a kind does — when placement picks it, how its payloads
    are encoded — is registered in :mod:`omnictl.transports.registry`.
    """

    __slots__ = ("value",)
    value: str
    _kinds: ClassVar[dict[str, Transport]] = {}
    INPROC: ClassVar[Transport]  # same process: the object is passed, no serialization
    CUDA_IPC: ClassVar[Transport]  # different processes, same GPU
    SHM: ClassVar[Transport]  # different processes, at least one side on CPU
    RELAY: ClassVar[Transport]  # different GPUs: staged through host shared memory, like shm
    TCP: ClassVar[Transport]  # processes on different nodes (`node` labels): ZeroMQ over TCP, zero-copy frames

    def __new__(cls, value: str) -> Transport:
        kind = cls._kinds.get(value)
        if kind is None:
            kind = object.__new__(cls)
            object.__setattr__(kind, "value", value)
            cls._kinds[value] = kind
        return kind

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Transport is immutable")

    def __reduce__(self) -> tuple[type[Transport], tuple[str]]:
        return Transport, (self.value,)  # unpickled as the same object

    def __repr__(self) -> str:
        return f"Transport({self.value!r})"

    def __str__(self) -> str:
        return self.value


Transport.INPROC = Transport("inproc")
Transport.CUDA_IPC = Transport("cuda_ipc")
Transport.SHM = Transport("shm")
Transport.RELAY = Transport("relay")
Transport.TCP = Transport("tcp")


@dataclass(frozen=True)
class RelayKnobs:
    """Transport tuning; never the transport itself (that is derived from placement)."""

    slot_bytes: int = 8 * 1024 * 1024
    slots: int = 8
    inline_bytes: int = 16 * 1024
    # Requests that may wait at this stage for its scheduler (its inbox). While that many
    # wait, the coordinator admits no new request (they wait at admission or get 429),
    # so a stage that falls behind slows admission instead of growing its memory.
    inbox: int = 32


@dataclass(frozen=True)
class WireLayout:
    """What an :class:`~omnictl.transports.endpoint.Endpoint` reads of a topology, as plain
    data (``Topology.wire_layout()`` makes it): where each OS process runs, each stage's
    relay knobs, and whether payloads may be pickled."""

    nodes: Mapping[str, str | None]  # OS process (a replica's name) -> its `node` label (None: the coordinator's)
    relays: Mapping[str, RelayKnobs]  # stage -> the knobs its shared-memory slots and codecs use
    allow_pickle: bool = False  # payloads between processes may carry any Python object, pickled

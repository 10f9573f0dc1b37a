"""Which transport an edge uses, and how its payloads are encoded: one registry.

A transport registers itself once, as a :class:`TransportPlugin`: its kind, when placement
selects it (a predicate over where the edge's two ends run, tried in ``rank`` order), its
codec class, and what it needs of the sockets (``frames``: tensors ride as frames of the
message, the way processes on different nodes exchange them). :func:`select` is what
:mod:`omnictl.topology.derive` asks for every edge; :func:`codec_for` is what each
process's :class:`~omnictl.transports.endpoint.Endpoint` asks for every (stage, transport).

Built-in transports are registered below. A plug-in is a module of its own, found through
the ``omnictl.transports`` entry-point group (each entry point names a
:class:`TransportPlugin` or a callable returning one) the first time the registry is
consulted, in every process: see ``docs/adding-a-transport.md``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata
from typing import Callable

from omnictl.transports.codec import PayloadCodec
from omnictl.transports.cuda_ipc import CudaIpcCodec
from omnictl.transports.kinds import RelayKnobs, Transport
from omnictl.transports.shm import SlotPool
from omnictl.transports.tcp import TcpCodec

ENTRY_POINT_GROUP = "omnictl.transports"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Where the two ends of an edge run. ``*_node``: `node` labels (None: the
    coordinator's machine); ``*_gpu``: the stage's GPU ids (empty: a CPU stage)."""

    same_process: bool
    src_node: str | None = None
    dst_node: str | None = None
    src_gpu: tuple[int, ...] = ()
    dst_gpu: tuple[int, ...] = ()


@dataclass(frozen=True)
class TransportPlugin:
    kind: Transport
    selects: Callable[[Placement], bool]  # whether placement picks this transport for an edge
    rank: int  # lower ranks are asked first; the first that selects wins
    codec: type[PayloadCodec] | None  # None: the object itself is handed over (one process)
    frames: bool = False  # tensors travel as frames of the message (tcp sockets), not in a slot


_PLUGINS: dict[Transport, TransportPlugin] = {}
_discovered = False


def register(plugin: TransportPlugin) -> None:
    """Add (or replace) the transport ``plugin.kind``."""
    _PLUGINS[plugin.kind] = plugin


def _discover() -> None:
    """Register the plug-ins installed in this environment, once per process."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        loaded = entry.load()
        plugin = loaded() if callable(loaded) and not isinstance(loaded, TransportPlugin) else loaded
        if not isinstance(plugin, TransportPlugin):
            raise TypeError(
                f"entry point {entry.name!r} ({entry.value}) in group {ENTRY_POINT_GROUP!r} gave a "
                f"{type(plugin).__name__}, not a TransportPlugin"
            )
        register(plugin)
        log.debug("transport %r registered by %s", plugin.kind.value, entry.value)


def plugins() -> list[TransportPlugin]:
    """Every registered transport, in the order placement asks them."""
    _discover()
    return sorted(_PLUGINS.values(), key=lambda p: p.rank)


def plugin(kind: Transport) -> TransportPlugin:
    _discover()
    found = _PLUGINS.get(kind)
    if found is None:
        known = ", ".join(sorted(k.value for k in _PLUGINS))
        raise LookupError(
            f"no transport {kind.value!r} is registered in this process (registered: {known}); "
            f"is the plug-in that provides it installed here?"
        )
    return found


def select(placement: Placement) -> Transport:
    """The transport placement implies for an edge; never configured."""
    for candidate in plugins():
        if candidate.selects(placement):
            return candidate.kind
    raise LookupError(f"no registered transport selects {placement}")


def codec_for(transport: Transport, pool: SlotPool, knobs: RelayKnobs, allow_pickle: bool = False) -> PayloadCodec:
    """A codec for a sending stage's edges of ``transport``."""
    codec = plugin(transport).codec
    if codec is None:
        raise ValueError(f"{transport.value} edges pass objects directly and use no codec")
    return codec(pool, knobs, allow_pickle)


# --- the built-in transports ----------------------------------------------------------

register(TransportPlugin(Transport.INPROC, lambda p: p.same_process, rank=0, codec=None))
register(TransportPlugin(Transport.TCP, lambda p: p.src_node != p.dst_node, rank=10, codec=TcpCodec, frames=True))
register(TransportPlugin(Transport.SHM, lambda p: not p.src_gpu or not p.dst_gpu, rank=20, codec=PayloadCodec))
# tensor-parallel groups talk through rank 0: the first GPU of each list
register(TransportPlugin(Transport.CUDA_IPC, lambda p: p.src_gpu[0] == p.dst_gpu[0], rank=30, codec=CudaIpcCodec))
# different GPUs: host-staged, the same shared memory as shm
register(TransportPlugin(Transport.RELAY, lambda p: True, rank=40, codec=PayloadCodec))

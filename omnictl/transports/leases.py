"""Receive shared-memory payloads as views: no copy out of the sender's slot.

A received payload's tensors (numpy or torch) are built directly on the mapped slot. The
slot is *leased*: it goes back to the sender's pool (``SlotRelease``) only when the last
tensor, slice or view built on it is freed, so a slot is never reused while anything can
still read it. The lifetime is tracked on one exporter object per payload (a ctypes array
over the mapped segment): numpy and torch keep the exporter itself alive through the
buffer they hold, and a ``weakref.finalize`` on it hands the slot back.

A tensor may be freed on any thread (a scheduler's worker thread, the garbage collector),
so the finalizer only queues the slot; the owning event loop sends the release.

Bounded: a process holds at most ``budget_bytes`` of leased payloads. A receiver that
keeps what it received (a cache, a result the caller never drops) does not starve the
sender: past the budget, payloads are copied out and their slots released at once (the
behaviour before views; logged once per process). The sender itself never blocks either:
with every slot leased, it gives a payload a segment of its own (``SlotPool.acquire``).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Callable

from omnictl.handoff import Handoff
from omnictl.messages import EncodedPayload, ShmRef
from omnictl.transports.codec import decode
from omnictl.transports.packing import unpack
from omnictl.transports.shm import SegmentReader

DEFAULT_BUDGET_BYTES = 512 * 1024 * 1024  # leased payloads one process may hold at once

log = logging.getLogger(__name__)


class ViewLeases:
    """One process's receive side: decodes payloads as views and releases their slots
    (``release(ref)``, called on the event loop) once nothing uses them any more."""

    def __init__(
        self,
        reader: SegmentReader,
        release: Callable[[ShmRef], None],
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        wake: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        """``wake(fn)`` runs ``fn`` on the thread that owns ``release``'s socket; by default
        the running loop's ``call_soon_threadsafe`` (so build this on the loop)."""
        self.reader = reader
        self.budget_bytes = budget_bytes
        self.held_bytes = 0  # leased and not yet released (changed on the loop only)
        self.held = 0  # payloads leased and not yet released
        self.copied = 0  # payloads copied out because the budget was spent
        self._release = release
        # slots whose views died (on any thread), released on the loop in one call per burst
        self._dead = Handoff(
            self._released, wake if wake is not None else asyncio.get_running_loop().call_soon_threadsafe
        )
        self._warned = False
        self.closed = False

    def decode(
        self, payload: EncodedPayload, allow_pickle: bool = False, frames: list[memoryview] | None = None
    ) -> Any:
        """The payload's data; its slot (if any) is released now or when its views die.
        ``frames``: a ``tcp`` payload's tensor frames (its tensors are views of them)."""
        ref = payload.shm
        if ref is None:
            return decode(payload, self.reader, allow_pickle, frames=frames)
        if not payload.layout or self.held_bytes + ref.nbytes > self.budget_bytes:
            if payload.layout:
                self._over_budget(ref)
            try:
                return decode(payload, self.reader, allow_pickle)
            finally:
                self._release(ref)
        exporter = self.reader.exporter(ref)
        self.held_bytes += ref.nbytes
        self.held += 1
        finalizer = weakref.finalize(exporter, self._died, ref)
        finalizer.atexit = False  # at interpreter exit the owner unlinks its segments anyway
        return unpack(payload.skeleton, payload.layout, exporter, allow_pickle, views=True, base=ref.offset)

    def _over_budget(self, ref: ShmRef) -> None:
        self.copied += 1
        if not self._warned:
            self._warned = True
            log.warning(
                "this process holds %d MiB of received tensors as views of their senders' shared memory "
                "(budget %d MiB); copying further payloads out instead (slot of stage %r, owner %r)",
                self.held_bytes >> 20,
                self.budget_bytes >> 20,
                ref.stage,
                ref.owner,
            )

    def _died(self, ref: ShmRef) -> None:
        """Finalizer: may run on any thread, inside the garbage collector. Only queues."""
        try:
            self._dead.put(ref)
        except RuntimeError:  # the event loop is closed: the process is going away
            self.closed = True

    def flush(self) -> None:
        """Release every slot whose views died (on the thread that owns the sockets)."""
        self._dead.drain()

    def _released(self, ref: ShmRef) -> None:
        self.held_bytes -= ref.nbytes
        self.held -= 1
        if not self.closed:
            self._release(ref)

    def close(self) -> None:
        """No more releases go out (the sockets are closing); views stay readable."""
        self.closed = True

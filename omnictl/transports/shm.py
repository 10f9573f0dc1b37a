"""Shared-memory slots: the sender packs tensors into a reusable slot and sends only a
small control message; the receiver reads them in place (views, see
:mod:`omnictl.transports.leases`) or copies them out, and hands the slot back.

A payload larger than a slot, or sent while every slot is taken, gets a segment of its
own (kept as a spare for reuse once released), so sending never blocks.
"""

from __future__ import annotations

import _posixshmem  # CPython's POSIX shm binding, the one SharedMemory uses
import ctypes
import itertools
import mmap
import os
import uuid
from collections import OrderedDict
from multiprocessing import shared_memory

from omnictl.messages import ShmRef

_SPARE_SEGMENTS = 2  # large segments a pool keeps for reuse after release


def _segment_name() -> str:
    return f"omx{os.getpid()}_{uuid.uuid4().hex[:12]}"


def _buffer(segment: shared_memory.SharedMemory) -> memoryview:
    buffer = segment.buf
    if buffer is None:  # only after close()
        raise ValueError(f"shared memory segment {segment.name} is closed")
    return buffer


def _creator_alive(name: str) -> bool:
    """Whether the process that created segment ``name`` (``omx<pid>_...``) still exists."""
    try:
        os.kill(int(name[3:].split("_", 1)[0]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):  # someone else's process (the pid was reused), or not our name
        return True
    return True


class AttachedSegment:
    """A segment another process owns, mapped read/write.

    Not ``SharedMemory(create=False)``: before Python 3.13 that registers the segment
    with the resource tracker (shared by every process we spawn) as if we owned it.
    Only the owner unlinks; its tracker cleans up if the owner is killed.
    """

    def __init__(self, name: str) -> None:
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._map)

    def close(self) -> bool:
        """Unmap now; False when views of it are still alive (leased payloads): it is then
        unmapped when the last of them dies."""
        try:
            self.buf.release()
            self._map.close()
        except BufferError:
            return False
        return True


class SlotPool:
    """The sending stage's slots. Created lazily: a stage that never sends over shm
    never allocates.

    Payloads larger than a slot get a segment of their own (sized to a power of two);
    released ones are kept as spares for the next large payload, because creating and
    first-touching a fresh 64 MiB segment costs several times the copy itself.
    """

    def __init__(self, owner: str, stage: str, slot_bytes: int, slots: int) -> None:
        self.owner = owner
        self.stage = stage
        self.slot_bytes = slot_bytes
        self.slots = slots
        self._segment: shared_memory.SharedMemory | None = None
        self._free: list[int] = list(range(slots - 1, -1, -1))
        self._large: dict[str, tuple[shared_memory.SharedMemory, int]] = {}  # in flight, with their lease
        self._leases = itertools.count(1)  # one per acquire: see ShmRef.lease
        self._slot_lease: list[int] = [0] * slots  # the current lease of each slot
        self._spare: list[shared_memory.SharedMemory] = []  # released, kept for reuse
        # Refs sent to another OS process and not released yet, by (segment, slot): if that
        # process dies, they never will be (see reclaim).
        self._sent: dict[tuple[str, int], tuple[ShmRef, str]] = {}

    @property
    def in_use(self) -> int:
        return (self.slots - len(self._free)) + len(self._large)

    def acquire(self, nbytes: int) -> tuple[ShmRef, memoryview]:
        if nbytes <= self.slot_bytes and self._free:
            if self._segment is None:
                self._segment = shared_memory.SharedMemory(
                    name=_segment_name(), create=True, size=self.slot_bytes * self.slots
                )
            slot = self._free.pop()
            start = slot * self.slot_bytes
            lease = self._slot_lease[slot] = next(self._leases)
            ref = ShmRef(self.owner, self.stage, self._segment.name, slot, start, nbytes, lease)
            return ref, _buffer(self._segment)[start : start + nbytes]
        segment = self._take_spare(nbytes) or shared_memory.SharedMemory(
            name=_segment_name(), create=True, size=1 << max(nbytes - 1, 1).bit_length()
        )
        lease = next(self._leases)
        self._large[segment.name] = (segment, lease)
        return ShmRef(self.owner, self.stage, segment.name, -1, 0, nbytes, lease), _buffer(segment)[:nbytes]

    def _take_spare(self, nbytes: int) -> shared_memory.SharedMemory | None:
        for i, segment in enumerate(self._spare):
            if nbytes <= segment.size <= 4 * nbytes:  # don't park a small payload in a huge one
                return self._spare.pop(i)
        return None

    def sent(self, ref: ShmRef, process: str) -> None:
        """``ref`` went to the OS process ``process``, which releases it once read."""
        self._sent[(ref.segment, ref.slot)] = (ref, process)

    def reclaim(self, process: str) -> int:
        """``process`` died: release what was sent to it and not released (it was lost with
        the process). The sender drops its socket to ``process`` first, so no message still
        queued there reaches the replacement and releases a reused slot a second time.
        Returns how many were taken back."""
        lost = [ref for ref, to in self._sent.values() if to == process]
        for ref in lost:
            self.release(ref)
        return len(lost)

    def release(self, ref: ShmRef) -> None:
        """``ref`` was read: its slot (or segment) may be lent again. A release of an older
        lease (sent by a process that died, read after its slots were taken back and lent
        again) is ignored: the slot is someone else's now."""
        if ref.slot < 0:
            held = self._large.get(ref.segment)
            if held is None or held[1] != ref.lease:
                return
            del self._large[ref.segment]
            self._sent.pop((ref.segment, ref.slot), None)
            self._spare.append(held[0])
            if len(self._spare) > _SPARE_SEGMENTS:
                _unlink(self._spare.pop(0))
            return
        if self._segment is None or ref.segment != self._segment.name or ref.slot in self._free:
            return
        if self._slot_lease[ref.slot] != ref.lease:
            return
        self._sent.pop((ref.segment, ref.slot), None)
        self._free.append(ref.slot)

    def close(self) -> None:
        segments = [*(segment for segment, _ in self._large.values()), *self._spare]
        if self._segment is not None:
            segments.append(self._segment)
        for segment in segments:
            _unlink(segment)
        self._large.clear()
        self._spare.clear()
        self._sent.clear()
        self._segment = None


def _unlink(segment: shared_memory.SharedMemory) -> None:
    try:
        segment.close()
    except BufferError:
        pass  # a view into it is still alive somewhere; unlinking still frees the name
    segment.unlink()


class SegmentReader:
    """The receiving side: keeps recently used segments mapped (bounded, so segments
    their owner has unlinked are eventually unmapped too).

    A segment whose creator died (a stage process killed) is unmapped at the next new
    segment read, or by :meth:`drop_dead`: its creator's resource tracker unlinked the name,
    but a mapping here would keep its memory (up to a whole slot pool) for as long as it stays.
    """

    def __init__(self, capacity: int = 16) -> None:
        self._capacity = capacity
        self._mapped: OrderedDict[str, AttachedSegment] = OrderedDict()

    def _segment(self, name: str) -> AttachedSegment:
        segment = self._mapped.get(name)
        if segment is None:
            self.drop_dead()
            segment = self._mapped[name] = AttachedSegment(name)
            if len(self._mapped) > self._capacity:
                _, evicted = self._mapped.popitem(last=False)
                evicted.close()  # forgotten either way; unmapped once no view of it is left
        else:
            self._mapped.move_to_end(name)
        return segment

    def read(self, ref: ShmRef) -> memoryview:
        """A view of the referenced bytes; release it once they are copied out."""
        return self._segment(ref.segment).buf[ref.offset : ref.offset + ref.nbytes]

    def exporter(self, ref: ShmRef) -> ctypes.Array:
        """A new object exporting the whole mapped segment of ``ref`` (so buffers taken
        from it keep the object itself alive: see :mod:`omnictl.transports.leases`). Typed
        by segment size, of which there are few: ctypes caches one array type per size."""
        buf = self._segment(ref.segment).buf
        return (ctypes.c_char * len(buf)).from_buffer(buf)

    def drop_dead(self) -> None:
        """Unmap the segments of processes that no longer exist."""
        for name in [name for name in self._mapped if not _creator_alive(name)]:
            # forgotten either way: with views of it alive (leased tensors, a copy-out in
            # progress) the mapping goes when the last of them does
            self._mapped.pop(name).close()

    def close(self) -> None:
        for segment in self._mapped.values():
            segment.close()
        self._mapped.clear()

"""Shared-memory slots: the sender packs tensors into a reusable slot and sends only a
small control message; the receiver copies them out and hands the slot back.

A payload larger than a slot, or sent while every slot is taken, gets a dedicated
segment that is unlinked when released, so sending never blocks.
"""

from __future__ import annotations

import mmap
import os
import uuid
from multiprocessing import shared_memory

import _posixshmem  # CPython's POSIX shm binding, the one SharedMemory uses

from omnictl.messages import ShmRef


def _segment_name() -> str:
    return f"omx{os.getpid()}_{uuid.uuid4().hex[:12]}"


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

    def close(self) -> None:
        self.buf.release()
        self._map.close()


class SlotPool:
    """The sending stage's slots. Created lazily: a stage that never sends over shm
    never allocates."""

    def __init__(self, owner: str, stage: str, slot_bytes: int, slots: int) -> None:
        self.owner = owner
        self.stage = stage
        self.slot_bytes = slot_bytes
        self.slots = slots
        self._segment: shared_memory.SharedMemory | None = None
        self._free: list[int] = list(range(slots - 1, -1, -1))
        self._dedicated: dict[str, shared_memory.SharedMemory] = {}

    @property
    def in_use(self) -> int:
        return (self.slots - len(self._free)) + len(self._dedicated)

    def acquire(self, nbytes: int) -> tuple[ShmRef, memoryview]:
        if nbytes <= self.slot_bytes and self._free:
            if self._segment is None:
                self._segment = shared_memory.SharedMemory(
                    name=_segment_name(), create=True, size=self.slot_bytes * self.slots
                )
            slot = self._free.pop()
            start = slot * self.slot_bytes
            ref = ShmRef(self.owner, self.stage, self._segment.name, slot, start, nbytes)
            return ref, self._segment.buf[start : start + nbytes]
        segment = shared_memory.SharedMemory(name=_segment_name(), create=True, size=max(nbytes, 1))
        self._dedicated[segment.name] = segment
        return ShmRef(self.owner, self.stage, segment.name, -1, 0, nbytes), segment.buf[:nbytes]

    def release(self, ref: ShmRef) -> None:
        if ref.slot < 0:
            segment = self._dedicated.pop(ref.segment, None)
            if segment is not None:
                segment.close()
                segment.unlink()
            return
        if self._segment is not None and ref.segment == self._segment.name and ref.slot not in self._free:
            self._free.append(ref.slot)

    def close(self) -> None:
        segments = list(self._dedicated.values())
        if self._segment is not None:
            segments.append(self._segment)
        for segment in segments:
            try:
                segment.close()
            except BufferError:
                # A view into it is still alive somewhere; unlinking still frees the name.
                pass
            segment.unlink()
        self._dedicated.clear()
        self._segment = None


class SegmentReader:
    """The receiving side: attaches pool segments once and keeps them mapped."""

    def __init__(self) -> None:
        self._pools: dict[str, AttachedSegment] = {}

    def read(self, ref: ShmRef) -> tuple[memoryview, AttachedSegment | None]:
        """A view of the referenced bytes; the second item is a dedicated segment the
        caller must close once it has copied the bytes out."""
        if ref.slot < 0:
            segment = AttachedSegment(ref.segment)
            return segment.buf[: ref.nbytes], segment
        segment = self._pools.get(ref.segment)
        if segment is None:
            segment = self._pools[ref.segment] = AttachedSegment(ref.segment)
        return segment.buf[ref.offset : ref.offset + ref.nbytes], None

    def close(self) -> None:
        for segment in self._pools.values():
            try:
                segment.close()
            except BufferError:
                pass
        self._pools.clear()

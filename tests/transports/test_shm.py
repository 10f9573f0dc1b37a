from __future__ import annotations

import os
import signal
import subprocess

import pytest
import torch

from omnictl.messages import ShmRef
from omnictl.topology.model import RelayKnobs
from omnictl.transports.codec import PayloadCodec, decode
from omnictl.transports.shm import SegmentReader, SlotPool


def segments() -> set[str]:
    """This process's segments (``omx<pid>_...``): /dev/shm is shared with the whole machine."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"omx{os.getpid()}_")}


def make(slot_bytes: int = 1 << 16, slots: int = 2, inline: int = 256) -> PayloadCodec:
    return PayloadCodec(SlotPool("p", "s", slot_bytes, slots), RelayKnobs(slot_bytes, slots, inline))


def test_tiny_payloads_ride_inline() -> None:
    codec = make()
    payload = codec.encode({"t": torch.ones(4)})
    assert payload.shm is None and len(payload.inline) >= 16
    assert torch.equal(decode(payload, SegmentReader())["t"], torch.ones(4))
    assert codec.pool.in_use == 0


def test_slots_are_reused_after_release_and_oversized_payloads_get_their_own_segment() -> None:
    before = segments()
    codec, reader = make(), SegmentReader()
    first = codec.encode({"t": torch.full((1000,), 1.0)})
    second = codec.encode({"t": torch.full((1000,), 2.0)})
    assert first.shm is not None and second.shm is not None
    assert {first.shm.slot, second.shm.slot} == {0, 1}
    third = codec.encode({"t": torch.full((1000,), 3.0)})  # both slots taken: dedicated
    big = codec.encode({"t": torch.zeros(100_000)})  # larger than a slot: dedicated
    assert third.shm is not None and third.shm.slot == -1 and big.shm is not None and big.shm.slot == -1
    assert codec.pool.in_use == 4
    for payload, value in ((first, 1.0), (second, 2.0), (third, 3.0)):
        assert decode(payload, reader)["t"][0].item() == value
        assert payload.shm is not None
        codec.pool.release(payload.shm)
    assert big.shm is not None
    codec.pool.release(big.shm)
    assert codec.pool.in_use == 0
    reused = codec.encode({"t": torch.full((1000,), 4.0)})
    assert reused.shm is not None and reused.shm.segment == first.shm.segment
    big_again = codec.encode({"t": torch.ones(90_000)})  # the released large segment is reused
    assert big_again.shm is not None and big_again.shm.segment == big.shm.segment
    assert decode(big_again, reader)["t"].sum().item() == 90_000
    reader.close()
    codec.pool.close()
    assert segments() <= before


def test_refs_name_their_owner_and_stage_and_large_segments_round_up_to_a_power_of_two() -> None:
    pool = SlotPool("proc", "stg", 1 << 16, 2)
    try:
        small, view = pool.acquire(1 << 16)  # exactly one slot: still a slot
        view.release()
        assert (small.owner, small.stage, small.nbytes) == ("proc", "stg", 1 << 16) and small.slot >= 0
        big, view = pool.acquire((1 << 17) + 1)
        view.release()
        assert (big.owner, big.stage, big.slot, big.offset, big.nbytes) == ("proc", "stg", -1, 0, (1 << 17) + 1)
        assert os.stat(f"/dev/shm/{big.segment}").st_size == 1 << 18
        assert big.segment != small.segment and pool.in_use == 2
    finally:
        pool.close()


def test_a_release_read_after_its_slot_was_reclaimed_and_lent_again_is_ignored() -> None:
    # The race: a process reads a payload, sends its release and dies; its death is handled
    # (reclaim) before the release is read, the slot is lent to the next payload, then the
    # late release arrives. Freeing the slot then would let a third payload overwrite the
    # second while it is still being read.
    pool = SlotPool("me", "s", 1024, 2)
    try:
        old, view = pool.acquire(100)
        view.release()
        pool.sent(old, "dead")
        assert pool.reclaim("dead") == 1 and pool.in_use == 0
        new, view = pool.acquire(100)
        view.release()
        assert (new.segment, new.slot) == (old.segment, old.slot) and new.lease != old.lease
        pool.sent(new, "alive")
        pool.release(old)  # late
        assert pool.in_use == 1
        third, view = pool.acquire(100)
        view.release()
        assert (third.segment, third.slot) != (new.segment, new.slot)
        pool.release(new)
        pool.release(third)
        assert pool.in_use == 0
        assert pool.reclaim("alive") == 0  # released: nothing left to take back
    finally:
        pool.close()


def test_a_late_release_of_a_reused_large_segment_is_ignored() -> None:
    pool = SlotPool("me", "s", 64, 1)
    try:
        old, view = pool.acquire(1000)  # larger than a slot: a segment of its own
        view.release()
        pool.sent(old, "dead")
        pool.reclaim("dead")
        new, view = pool.acquire(1000)  # the spare segment, lent again
        view.release()
        assert new.segment == old.segment and new.slot == old.slot == -1
        pool.release(old)  # late
        assert pool.in_use == 1
        pool.release(new)
        assert pool.in_use == 0
    finally:
        pool.close()


def test_a_spare_segment_is_reused_for_a_payload_from_its_size_down_to_a_quarter_of_it() -> None:
    # Large segments are powers of two; a spare serves payloads that fit it without
    # wasting more than three quarters of it, and no others.
    pool = SlotPool("me", "s", 64, 1)
    try:
        def spare_after(nbytes: int) -> str:
            ref, view = pool.acquire(nbytes)
            view.release()
            pool.release(ref)
            return ref.segment

        segment = spare_after(1 << 18)  # exactly a power of two: a segment of that size
        assert os.stat(f"/dev/shm/{segment}").st_size == 1 << 18
        assert spare_after(1 << 18) == segment  # the same size again: the spare
        assert spare_after(1 << 16) == segment  # a quarter of it: still the spare
        other = spare_after((1 << 16) - 1000)  # less than a quarter: a segment of its own
        assert other != segment and os.stat(f"/dev/shm/{other}").st_size == 1 << 16
        bigger = spare_after((1 << 18) + 1)  # more than the spare holds
        assert bigger not in (segment, other)
    finally:
        pool.close()


def test_a_segment_names_its_creator_and_only_a_process_known_to_be_gone_counts_as_dead() -> None:
    from omnictl.transports.shm import _creator_alive, _segment_name

    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = gone.pid  # exited and reaped: no such process (unless the pid was reused at once)
    assert _creator_alive(_segment_name()) is True  # this process's own name
    assert _creator_alive(f"omx{os.getpid()}_{'0' * 12}") is True
    assert _creator_alive(f"omx{os.getppid()}_{'0' * 12}") is True
    assert _creator_alive(f"omx{dead}_{'0' * 12}") is False
    assert _creator_alive("omxnotapid_x") is True  # not our name: never taken for dead


def test_a_released_large_segment_is_no_longer_counted_as_sent_to_its_reader() -> None:
    pool = SlotPool("me", "s", 64, 1)
    try:
        ref, view = pool.acquire(1000)
        view.release()
        pool.sent(ref, "alive")
        pool.release(ref)
        assert pool.reclaim("alive") == 0  # nothing of it is left to take back
    finally:
        pool.close()


def test_at_most_two_released_large_segments_are_kept_the_oldest_goes_first() -> None:
    pool = SlotPool("me", "s", 64, 1)
    try:
        refs = []
        for _ in range(3):  # all in flight at once: three segments
            ref, view = pool.acquire(1000)
            view.release()
            refs.append(ref)
        names = [ref.segment for ref in refs]
        assert len(set(names)) == 3 and all(os.path.exists(f"/dev/shm/{n}") for n in names)
        for ref in refs:
            pool.release(ref)
        assert [os.path.exists(f"/dev/shm/{n}") for n in names] == [False, True, True]
    finally:
        pool.close()


def test_a_release_of_a_slot_this_pool_never_lent_is_ignored() -> None:
    pool = SlotPool("me", "s", 1024, 2)
    try:
        pool.release(ShmRef("me", "s", "omx1_000000000000", 0, 0, 100, 1))  # before any slot exists
        mine, view = pool.acquire(100)
        view.release()
        # another segment's ref with the very slot and lease of ours (another pool's, say)
        pool.release(ShmRef("me", "s", "omx1_000000000000", mine.slot, mine.offset, 100, mine.lease))
        assert pool.in_use == 1
        pool.release(mine)
        pool.release(mine)  # twice: the slot is already free
        assert pool.in_use == 0
        first, view = pool.acquire(100)
        view.release()
        second, view = pool.acquire(100)
        view.release()
        assert first.slot != second.slot  # a double release did not free a slot twice over
    finally:
        pool.close()


def test_a_reader_maps_each_segment_once_however_often_it_is_read() -> None:
    pool = SlotPool("me", "s", 1024, 2)
    reader = SegmentReader()
    try:
        first, view = pool.acquire(100)
        view[:5] = b"first"
        view.release()
        second, view = pool.acquire(100)
        view[:6] = b"second"
        view.release()
        def mappings() -> int:
            return open("/proc/self/maps").read().count(f"/dev/shm/{first.segment}")

        owners = mappings()  # the pool's own (the reader is in the same process here)
        views = [reader.read(first), reader.read(second), reader.read(first)]  # all kept alive
        assert bytes(views[0][:5]) == b"first" and bytes(views[1][:6]) == b"second"
        assert mappings() == owners + 1
        for view in views:
            view.release()
    finally:
        reader.close()
        pool.close()


def test_an_attached_segment_says_whether_it_could_unmap_now() -> None:
    from omnictl.transports.shm import AttachedSegment

    pool = SlotPool("me", "s", 1024, 1)
    try:
        ref, view = pool.acquire(10)
        view.release()
        attached = AttachedSegment(ref.segment)
        held = attached.buf[:4]  # a view of it is alive: it cannot unmap yet
        assert attached.close() is False
        held.release()
        assert AttachedSegment(ref.segment).close() is True
    finally:
        pool.close()


def test_a_segment_of_its_own_is_named_for_this_process_and_sized_to_a_power_of_two() -> None:
    pool = SlotPool("me", "s", 64, 1)
    try:
        slot, view = pool.acquire(10)  # the one slot, taken
        view.release()
        sizes = {}
        for nbytes in (1, 2, 3, 1000):  # while every slot is taken, even tiny payloads get their own
            ref, view = pool.acquire(nbytes)
            view.release()
            assert ref.slot == -1 and ref.segment.startswith(f"omx{os.getpid()}_")
            sizes[nbytes] = os.stat(f"/dev/shm/{ref.segment}").st_size
        assert sizes == {1: 2, 2: 2, 3: 4, 1000: 1024}
    finally:
        pool.close()


def test_a_closed_segment_has_no_buffer_to_lend() -> None:
    from multiprocessing import shared_memory

    from omnictl.transports.shm import _buffer

    segment = shared_memory.SharedMemory(create=True, size=16)
    segment.close()
    segment.unlink()
    with pytest.raises(ValueError, match=f"^shared memory segment {segment.name} is closed$"):
        _buffer(segment)


def test_asking_whether_a_process_is_alive_sends_it_no_signal() -> None:
    from omnictl.transports.shm import _creator_alive

    # a child that dies of any real signal (SIGHUP's default, whatever this process ignores)
    child = subprocess.Popen(["sleep", "5"], preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        assert _creator_alive(f"omx{child.pid}_{'0' * 12}") is True
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.2)  # still running: it was only asked about
    finally:
        child.kill()
        child.wait()

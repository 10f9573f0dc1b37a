"""Received shm payloads are views of the sender's slot; the slot goes back only when the
last view is freed, never while anything can still read it."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
from typing import Any, Awaitable, Callable

import numpy as np
import pytest
import torch

from omnictl.messages import ShmRef
from omnictl.topology.model import RelayKnobs
from omnictl.transports.codec import PayloadCodec
from omnictl.transports.leases import ViewLeases
from omnictl.transports.shm import SegmentReader, SlotPool

SLOT = 1 << 16


def segments() -> set[str]:
    """This process's segments (other test runs on the machine make their own)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"omx{os.getpid()}_")}


class Wire:
    """A sender's codec and a receiver's leases in one process; releases go straight
    back to the sender's pool (on the loop, as a worker's do)."""

    def __init__(self, slots: int = 2, budget: int = 1 << 30) -> None:
        self.codec = PayloadCodec(SlotPool("p", "s", SLOT, slots), RelayKnobs(SLOT, slots, 256))
        self.released: list[ShmRef] = []
        self.reader = SegmentReader()
        self.leases = ViewLeases(self.reader, self._release, budget_bytes=budget)

    def _release(self, ref: ShmRef) -> None:
        self.released.append(ref)
        self.codec.pool.release(ref)

    def send(self, data: Any) -> Any:
        return self.leases.decode(self.codec.encode(data))

    async def settle(self) -> None:
        """Let the loop run the queued releases."""
        for _ in range(3):
            await asyncio.sleep(0)

    def close(self) -> None:
        self.leases.close()
        self.reader.close()
        self.codec.pool.close()


def run(body: Callable[[Wire], Awaitable[None]], **kwargs: Any) -> None:
    before = segments()

    async def go() -> None:
        wire = Wire(**kwargs)
        try:
            await body(wire)
        finally:
            wire.close()

    asyncio.run(asyncio.wait_for(go(), 10))
    assert segments() <= before


def test_a_received_tensor_is_a_view_of_the_slot_and_the_slot_returns_when_it_is_freed() -> None:
    async def body(w: Wire) -> None:
        got = w.send({"t": torch.arange(1000, dtype=torch.float32), "n": 3})
        assert w.codec.pool.in_use == 1 and w.leases.held == 1
        # no copy: writing the slot's memory shows through the received tensor
        ref = w.leases.reader.read(w.codec.pool._segment and ShmRef("p", "s", w.codec.pool._segment.name, 0, 0, 4))
        np.frombuffer(ref, dtype=np.float32)[:] = -7.0
        ref.release()
        assert got["t"][0].item() == -7.0 and got["n"] == 3
        await w.settle()
        assert w.released == []  # still in use
        del got
        await w.settle()
        assert len(w.released) == 1 and w.codec.pool.in_use == 0 and w.leases.held_bytes == 0

    run(body)


@pytest.mark.parametrize("keep", [
    lambda t: t[10:20],  # a torch slice
    lambda t: t.view(10, 100)[3],  # a view of a view
    lambda t: t.numpy()[5:],  # numpy over the torch tensor
    lambda t: torch.from_numpy(t.numpy()).reshape(-1, 4),
    lambda t: memoryview(t.numpy()),
])
def test_any_view_derived_from_a_received_tensor_keeps_the_slot(keep: Callable[[torch.Tensor], Any]) -> None:
    async def body(w: Wire) -> None:
        got = w.send({"t": torch.arange(1000, dtype=torch.float32)})
        kept = keep(got["t"])
        del got
        gc.collect()
        await w.settle()
        assert w.released == [] and w.codec.pool.in_use == 1
        del kept
        await w.settle()
        assert len(w.released) == 1 and w.codec.pool.in_use == 0

    run(body)


def test_a_held_tensor_never_changes_while_more_payloads_flow_through_the_same_pool() -> None:
    async def body(w: Wire) -> None:
        held = [w.send({"t": torch.full((2000,), float(i)), "a": np.full(300, i, dtype=np.int64)}) for i in range(2)]
        for i in range(2, 40):  # both slots held: these get segments of their own, then reuse them
            out = w.send({"t": torch.full((2000,), float(i)), "a": np.full(300, i, dtype=np.int64)})
            assert out["t"][0].item() == i and out["a"][-1] == i
            del out
            await w.settle()
        for i, payload in enumerate(held):
            assert torch.equal(payload["t"], torch.full((2000,), float(i)))
            assert (payload["a"] == i).all()
        assert w.codec.pool.in_use == 2  # exactly the two held slots
        del held, payload
        await w.settle()
        assert w.codec.pool.in_use == 0

    run(body)


def test_a_tensor_freed_on_another_thread_is_released_on_the_loop() -> None:
    async def body(w: Wire) -> None:
        got = w.send({"t": torch.ones(5000)})
        loop_thread = threading.get_ident()
        threads: list[int] = []
        release = w.leases._release
        w.leases._release = lambda ref: (threads.append(threading.get_ident()), release(ref))  # type: ignore[method-assign]
        box = [got]
        del got
        worker = threading.Thread(target=box.clear)  # the last reference dies there
        worker.start()
        worker.join()
        await w.settle()
        assert threads == [loop_thread] and w.codec.pool.in_use == 0

    run(body)


def test_past_the_budget_payloads_are_copied_and_released_at_once(caplog: pytest.LogCaptureFixture) -> None:
    async def body(w: Wire) -> None:
        caplog.set_level(logging.WARNING, logger="omnictl.transports.leases")
        first = w.send({"t": torch.ones(3000)})  # 12 KB: within the 20 KB budget, leased
        second = w.send({"t": torch.full((3000,), 2.0)})  # would exceed it: copied
        third = w.send({"t": torch.full((3000,), 3.0)})
        assert w.leases.held == 1 and w.leases.copied == 2 and len(w.released) == 2
        assert w.codec.pool.in_use == 1
        assert second["t"][0].item() == 2.0 and third["t"][0].item() == 3.0 and first["t"][0].item() == 1.0
        warnings = [r for r in caplog.records if "copying further payloads out" in r.getMessage()]
        assert len(warnings) == 1 and "stage 's'" in warnings[0].getMessage()  # logged once, naming the sender

    run(body, budget=20_000)


def test_payloads_without_tensors_in_shm_and_inline_ones_need_no_lease() -> None:
    async def body(w: Wire) -> None:
        tiny = w.send({"t": torch.ones(4)})  # inline
        assert tiny["t"].sum().item() == 4 and w.leases.held == 0 and w.codec.pool.in_use == 0

    run(body)


def test_a_segment_evicted_from_the_reader_while_viewed_stays_readable() -> None:
    async def body(w: Wire) -> None:
        w.reader._capacity = 1
        big = [w.send({"t": torch.full((40_000,), float(i))}) for i in range(3)]  # own segments each
        assert len(w.reader._mapped) == 1
        for i, payload in enumerate(big):
            assert payload["t"][-1].item() == i
        del big, payload
        await w.settle()
        assert w.codec.pool.in_use == 0

    run(body)


def test_the_budget_warning_says_how_much_is_held_against_what_budget_and_whose_slot_it_is(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body(w: Wire) -> None:
        caplog.set_level(logging.WARNING, logger="omnictl.transports.leases")
        held = [w.send({"t": np.full(1 << 20, i, dtype=np.uint8)}) for i in range(5)]  # 5 MiB, leased
        copied = w.send({"t": np.zeros(3 << 19, dtype=np.uint8)})  # 1.5 MiB more: over the 6 MiB budget
        assert w.leases.held == 5 and w.leases.copied == 1 and copied["t"].size == 3 << 19
        assert [r.getMessage() for r in caplog.records] == [
            "this process holds 5 MiB of received tensors as views of their senders' shared memory "
            "(budget 6 MiB); copying further payloads out instead (slot of stage 's', owner 'p')"]
        del held

    run(body, budget=6 << 20)


def test_held_counts_each_leased_payload_until_its_views_die() -> None:
    async def body(w: Wire) -> None:
        first = w.send({"t": torch.ones(5000)})
        second = w.send({"t": torch.ones(5000)})
        third = w.send({"t": torch.ones(5000)})
        assert w.leases.held == 3
        del first
        await w.settle()
        assert w.leases.held == 2
        del second, third
        await w.settle()
        assert w.leases.held == 0 and w.leases.held_bytes == 0

    run(body)


def test_a_view_that_dies_after_its_loop_closed_sends_no_release_and_marks_the_leases_closed() -> None:
    # A process going away: its loop has closed while a received tensor is still alive.
    before = segments()
    released: list[ShmRef] = []
    pool = SlotPool("p", "s", SLOT, 2)
    codec = PayloadCodec(pool, RelayKnobs(SLOT, 2, 256))
    reader = SegmentReader()

    async def receive() -> tuple[ViewLeases, Any]:
        leases = ViewLeases(reader, released.append)
        return leases, leases.decode(codec.encode({"t": torch.ones(5000)}))

    try:
        leases, got = asyncio.run(receive())
        assert leases.held == 1 and not leases.closed
        del got  # the finalizer finds the loop closed
        gc.collect()
        assert leases.closed and released == []
    finally:
        reader.close()
        pool.close()
    assert segments() <= before


def test_a_pickled_leaf_is_refused_unless_the_receiver_opted_in() -> None:
    from omnictl.exceptions import UnsupportedPayload

    async def body(w: Wire) -> None:
        sender = PayloadCodec(w.codec.pool, w.codec.knobs, allow_pickle=True)
        with pytest.raises(UnsupportedPayload, match="allow_pickle"):
            w.leases.decode(sender.encode({"t": torch.ones(5000), "obj": complex(1, 2)}))
        got = w.leases.decode(sender.encode({"t": torch.ones(5000), "obj": complex(1, 2)}), allow_pickle=True)
        assert got["obj"] == complex(1, 2)
        del got
        gc.collect()
        await w.settle()

    run(body)


def test_frame_and_inline_payloads_pass_through_with_the_receivers_pickle_choice() -> None:
    from omnictl.exceptions import UnsupportedPayload
    from omnictl.transports.tcp import TcpCodec

    async def body(w: Wire) -> None:
        payload, frames = TcpCodec(w.codec.pool, w.codec.knobs, allow_pickle=True).encode_frames(
            {"x": np.arange(3), "obj": complex(1, 2)})
        buffers = [memoryview(bytearray(frame)) for frame in frames]
        got = w.leases.decode(payload, allow_pickle=True, frames=buffers)
        assert got["x"].tolist() == [0, 1, 2] and got["obj"] == complex(1, 2)
        inline = PayloadCodec(w.codec.pool, w.codec.knobs, allow_pickle=True).encode({"obj": complex(3, 4)})
        assert inline.shm is None
        assert w.leases.decode(inline, allow_pickle=True) == {"obj": complex(3, 4)}
        with pytest.raises(UnsupportedPayload):
            w.leases.decode(inline)
        assert w.leases.held == 0  # nothing of these is leased

    run(body)

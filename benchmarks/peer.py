"""A second process for the transfer benchmarks (``runtime.py``, ``shm.py``).

The parent sends one-frame requests, ``kind`` (1 byte) + its ``time.time_ns()`` when it
started (8 bytes, little-endian) + a body; the child answers each with whatever its
``answer`` function returns (msgpack), typically ``[one-way ns, slots to release]``. The
child reads shared memory as a stage process does: :class:`PeerSide` holds a
``SegmentReader`` and ``ViewLeases`` whose released slots collect in ``released``.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any, Callable

STOP = b"\x00"  # the parent is done (no benchmark uses this kind)
_REPLY_TIMEOUT_MS = 120_000  # a dead peer fails the run, it does not hang it


class PeerSide:
    """The child's receive side: payloads decoded as a stage process decodes them."""

    def __init__(self) -> None:
        import msgspec

        from omnictl.messages import EncodedPayload, ShmRef
        from omnictl.transports.leases import ViewLeases
        from omnictl.transports.shm import AttachedSegment, SegmentReader

        self.payloads = msgspec.msgpack.Decoder(EncodedPayload)
        self.reader = SegmentReader()
        self.released: list[ShmRef] = []
        # no event loop here: a freed view's slot is queued and flushed at once, on this thread
        self.leases = ViewLeases(self.reader, self.released.append, wake=lambda flush: flush())
        self._attached: dict[str, AttachedSegment] = {}

    def attach(self, name: str) -> Any:
        """A plain shared-memory segment of the parent's, mapped once."""
        from omnictl.transports.shm import AttachedSegment

        segment = self._attached.get(name)
        if segment is None:
            segment = self._attached[name] = AttachedSegment(name)
        return segment

    def close(self) -> None:
        self.leases.close()
        self.reader.close()
        for segment in self._attached.values():
            segment.close()


def serve(pull_address: str, push_address: str, answer: Callable[[PeerSide, bytes, int, bytes], Any]) -> None:
    """The child's loop: ``answer(side, kind, sent_ns, body)`` for each request, until STOP.
    Its first message is a hello, ``[0, None]``, that the parent waits for."""
    import msgspec
    import zmq

    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind(pull_address)
    push = context.socket(zmq.PUSH)
    push.connect(push_address)
    side = PeerSide()
    encode = msgspec.msgpack.encode
    push.send(encode([0, None]))
    while (raw := pull.recv())[:1] != STOP:
        push.send(encode(answer(side, raw[:1], int.from_bytes(raw[1:9], "little"), raw[9:])))
    side.close()
    push.close(linger=1000)
    pull.close(linger=0)
    context.term()


class Peer:
    """The parent's end: starts ``target(pull_address, push_address)`` in a spawned process
    (``serve`` with an answer function, usually) and decodes its replies as ``reply``."""

    def __init__(self, directory: Path, target: Callable[[str, str], None], reply: Any) -> None:
        import msgspec
        import zmq

        self._context = zmq.Context()
        directory.mkdir(parents=True, exist_ok=True)
        to_peer, from_peer = f"ipc://{directory}/peer-in", f"ipc://{directory}/peer-out"
        self._pull = self._context.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVTIMEO, _REPLY_TIMEOUT_MS)
        self._pull.bind(from_peer)
        self._push = self._context.socket(zmq.PUSH)
        self._push.connect(to_peer)
        self._reply = msgspec.msgpack.Decoder(reply)
        self._process = multiprocessing.get_context("spawn").Process(
            target=target, args=(to_peer, from_peer), daemon=True
        )
        self._process.start()
        self._pull.recv()  # hello

    def ask(self, kind: bytes, sent_ns: int, body: bytes = b"") -> Any:
        self._push.send(kind + sent_ns.to_bytes(8, "little") + body)
        return self._reply.decode(self._pull.recv())

    def close(self) -> None:
        self._push.send(STOP + bytes(8))
        self._process.join(10)
        self._push.close(linger=0)
        self._pull.close(linger=0)
        self._context.term()

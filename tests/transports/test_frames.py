"""Receiving one runtime message off an asyncio ZeroMQ socket: its header, then its tensor
frames, over real tcp sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from omnictl.transports.curve import CurveKeys, start_authenticator
from omnictl.transports.frames import receive


def exchange(parts_sent: list[list[bytes]], keys: CurveKeys | None = None) -> list[tuple[bytes, list[memoryview]]]:
    """Send each message of ``parts_sent`` (its frames) and receive them with ``receive``."""
    async def main() -> list[tuple[bytes, list[memoryview]]]:
        context = zmq.asyncio.Context()
        authenticator = start_authenticator(zmq.Context.shadow(context.underlying), keys) if keys else None
        pull = context.socket(zmq.PULL)
        if keys:
            keys.serve(pull)
        pull.bind("tcp://127.0.0.1:*")
        sender = zmq.Context()
        push = sender.socket(zmq.PUSH)
        if keys:
            keys.connect_as_client(push)
        push.connect(pull.getsockopt_string(zmq.LAST_ENDPOINT))
        got = []
        try:
            for parts in parts_sent:
                push.send_multipart(parts)
                got.append(await asyncio.wait_for(receive(pull), 10))
        finally:
            push.close(linger=0)
            sender.term()
            pull.close(linger=0)
            if authenticator is not None:
                authenticator.stop()
            context.term()
        return got

    return asyncio.run(main())


def test_a_header_alone_comes_with_no_frames_and_each_frame_after_it_as_a_view() -> None:
    got = exchange([[b"header-only"], [b"with-two", b"first frame", b"\x00" * 70_000], [b"next"]])
    assert [header for header, _ in got] == [b"header-only", b"with-two", b"next"]
    assert got[0][1] == [] and got[2][1] == []
    frames = got[1][1]
    assert all(isinstance(frame, memoryview) for frame in frames)  # zero-copy: views of the frames
    assert [bytes(frame) for frame in frames] == [b"first frame", b"\x00" * 70_000]
    assert isinstance(got[1][0], bytes)  # the header is copied out


def test_a_large_first_message_over_curve_is_waited_for_not_failed() -> None:
    # libzmq may report the socket readable before such a message is whole (EAGAIN on recv).
    big = b"\x01" * 2_000_000
    got = exchange([[b"h1", big], [b"h2"], [b"h3", big]], CurveKeys.generate())
    assert [(header, [len(frame) for frame in frames]) for header, frames in got] == [
        (b"h1", [2_000_000]), (b"h2", []), (b"h3", [2_000_000])]

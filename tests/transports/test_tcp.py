"""The tcp codec over a real ZeroMQ TCP socket pair on 127.0.0.1."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import numpy as np
import pytest
import torch
import zmq
import zmq.asyncio

from omnictl import messages as m
from omnictl.exceptions import UnsupportedPayload
from omnictl.stage.ports import payload_bytes
from omnictl.topology.model import RelayKnobs, Transport
from omnictl.transports.codec import decode
from omnictl.transports.registry import codec_for
from omnictl.transports.curve import CurveKeys, start_authenticator
from omnictl.transports.drain import Drain
from omnictl.transports.shm import SegmentReader, SlotPool
from omnictl.transports.tcp import TcpCodec

CTX = m.RequestContext("r1", {}, ("a", "b"))


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind("tcp://127.0.0.1:*")
    push = context.socket(zmq.PUSH)
    push.connect(pull.getsockopt(zmq.LAST_ENDPOINT).decode())
    yield push, pull
    push.close(linger=0)
    pull.close(linger=0)
    context.term()


def _roundtrip(pair: tuple[zmq.Socket, zmq.Socket], data: Any) -> tuple[m.DataReady, Any, int]:
    push, pull = pair
    pool = SlotPool("p", "a", 1024, 1)
    codec = codec_for(Transport.TCP, pool, RelayKnobs())
    assert isinstance(codec, TcpCodec)
    payload, frames = codec.encode_frames(data)
    push.send_multipart([m.encode(m.DataReady(CTX, "a", "b", payload, 0)), *frames], copy=False)  # as Outgoing sends it
    parts = pull.recv_multipart(copy=False)
    message = m.inbound_decoder.decode(parts[0].buffer)
    assert isinstance(message, m.DataReady)
    reader = SegmentReader()
    try:
        out = decode(message.payload, reader, frames=[part.buffer for part in parts[1:]])
    finally:
        reader.close()
        pool.close()
    return message, out, len(parts)


def test_tensors_travel_as_frames_after_a_typed_header(pair) -> None:
    array = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
    tensor = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    message, out, parts = _roundtrip(pair, {"x": array, "t": tensor, "meta": ["k", 3]})
    assert parts == 3  # header + one frame per tensor
    assert message.payload.frames and message.payload.inline == b"" and message.payload.shm is None
    assert len(message.payload.skeleton) < 200  # the bytes are not in the header
    assert payload_bytes(message.payload) >= array.nbytes + tensor.numel() * 8
    np.testing.assert_array_equal(out["x"], array)
    assert out["t"].dtype is torch.int64 and torch.equal(out["t"], tensor)
    assert out["meta"] == ["k", 3]
    assert not out["x"].flags.owndata  # a view of the received frame, not a copy
    out["x"][0] = 7.0  # the frame is the receiver's own: writable


def test_a_payload_without_tensors_is_one_frame(pair) -> None:
    message, out, parts = _roundtrip(pair, {"text": "hi", "n": 1})
    assert parts == 1 and not message.payload.frames
    assert out == {"text": "hi", "n": 1}


def test_a_frame_count_that_does_not_match_the_layout_is_refused() -> None:
    payload, frames = TcpCodec(SlotPool("p", "a", 1024, 1), RelayKnobs()).encode_frames({"x": np.zeros(4)})
    with pytest.raises(ValueError, match="1 tensor\\(s\\) but 0 frame"):
        decode(payload, SegmentReader(), frames=[])


def test_a_large_first_message_over_curve_with_zap_is_received_whole() -> None:
    """libzmq reports such a connection readable before the message is whole; the receiving
    drain must wait for it rather than die on EAGAIN (a receive loop did: a tensor opening a
    tcp edge hung the pipeline)."""
    keys = CurveKeys.generate()
    codec = TcpCodec(SlotPool("p", "a", 1024, 1), RelayKnobs())

    async def scenario() -> list[list[int]]:
        context = zmq.asyncio.Context()
        authenticator = start_authenticator(zmq.Context.shadow(context.underlying), keys)
        pull = zmq.Context.shadow(context.underlying).socket(zmq.PULL)
        keys.serve(pull)
        pull.bind("tcp://127.0.0.1:*")
        sender = zmq.Context()
        push = sender.socket(zmq.PUSH)
        keys.connect_as_client(push)
        push.connect(pull.getsockopt(zmq.LAST_ENDPOINT).decode())
        got: asyncio.Queue[list[int]] = asyncio.Queue()
        drain = Drain(pull, m.inbound_decoder.decode, lambda message, frames: got.put_nowait([len(f) for f in frames]),
                      "test")
        received = []
        try:
            for size in (2_000_000, 10, 2_000_000):
                payload, frames = codec.encode_frames({"x": np.zeros(size, dtype=np.uint8)})
                push.send_multipart([m.encode(m.DataReady(CTX, "a", "b", payload, 0)), *frames], copy=False)
                received.append(await asyncio.wait_for(got.get(), 30))
        finally:
            drain.close()
            push.close(linger=0)
            sender.term()
            pull.close(linger=0)
            authenticator.stop()
            context.term()
        return received

    assert asyncio.run(scenario()) == [[2_000_000], [10], [2_000_000]]


def test_a_pickled_leaf_in_a_frames_payload_is_refused_unless_the_receiver_opted_in() -> None:
    payload, frames = TcpCodec(SlotPool("p", "a", 1024, 1), RelayKnobs(), allow_pickle=True).encode_frames(
        {"x": np.ones(2), "obj": complex(1, 2)})
    buffers = [memoryview(bytearray(frame)) for frame in frames]
    with pytest.raises(UnsupportedPayload, match="allow_pickle"):
        decode(payload, SegmentReader(), frames=buffers)
    out = decode(payload, SegmentReader(), allow_pickle=True, frames=buffers)
    assert out["obj"] == complex(1, 2) and out["x"].tolist() == [1.0, 1.0]


def test_a_frame_of_the_wrong_size_is_refused_naming_the_tensor() -> None:
    payload, frames = TcpCodec(SlotPool("p", "a", 1024, 1), RelayKnobs()).encode_frames(
        {"a": np.zeros(4), "b": np.zeros(3)})
    short = [memoryview(bytearray(frames[0])), memoryview(bytearray(8))]
    with pytest.raises(ValueError, match=r"^tensor 1 is 24 bytes but its frame has 8$"):
        decode(payload, SegmentReader(), frames=short)


def test_empty_and_one_byte_tensors_arrive_as_views_with_their_dtype_shape_and_value() -> None:
    data = {"np_empty": np.empty((0, 3), dtype=np.int32), "np_byte": np.array([0xA5], dtype=np.uint8),
            "t_empty": torch.empty(0, 2, dtype=torch.int64), "t_byte": torch.tensor([0x5A], dtype=torch.uint8)}
    payload, frames = TcpCodec(SlotPool("p", "a", 1024, 1), RelayKnobs()).encode_frames(data)
    assert [entry.kind for entry in payload.layout] == ["numpy", "numpy", "torch", "torch"]  # the wire names them
    out = decode(payload, SegmentReader(), frames=[memoryview(bytearray(frame)) for frame in frames])
    assert out["np_empty"].dtype == np.int32 and out["np_empty"].shape == (0, 3)
    assert out["np_byte"].tolist() == [0xA5] and out["np_byte"].dtype == np.uint8
    assert out["t_empty"].dtype == torch.int64 and out["t_empty"].shape == (0, 2)
    assert out["t_byte"].tolist() == [0x5A] and out["t_byte"].dtype == torch.uint8


def test_a_tcp_codec_refuses_to_encode_into_a_slot() -> None:
    with pytest.raises(TypeError, match="^tcp payloads travel as frames: use encode_frames$"):
        TcpCodec(SlotPool("p", "a", 1024, 1), RelayKnobs()).encode({"x": 1})


def test_unpacking_frames_refuses_pickles_by_default_and_keeps_each_arrays_shape() -> None:
    from omnictl.transports.packing import unpack_frames

    payload, frames = TcpCodec(SlotPool("p", "a", 1024, 1), RelayKnobs(), allow_pickle=True).encode_frames(
        {"grid": np.arange(6, dtype=np.int16).reshape(2, 3), "obj": complex(1, 2)})
    buffers = [memoryview(bytearray(frame)) for frame in frames]
    with pytest.raises(UnsupportedPayload, match="allow_pickle"):
        unpack_frames(payload.skeleton, payload.layout, buffers)
    out = unpack_frames(payload.skeleton, payload.layout, buffers, allow_pickle=True)
    assert out["grid"].shape == (2, 3) and out["grid"].tolist() == [[0, 1, 2], [3, 4, 5]]

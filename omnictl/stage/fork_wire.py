"""The template's wire (:mod:`omnictl.stage.template`): length-prefixed frames and the
reports it sends. Apart from the template itself so that the launcher's side
(:mod:`omnictl.coordinator.forking`) reads it without importing the stage worker, which
imports the launcher (a cycle)."""

from __future__ import annotations

import struct

HEADER = struct.Struct("!I")
FORKED = struct.Struct("!ci")  # b"F", pid
EXITED = struct.Struct("!cii")  # b"X", pid, exit code (negative: killed by that signal)
READY = b"R"


def frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


class Frames:
    """Splits a byte stream into frames (both ends use it)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        frames: list[bytes] = []
        while len(self._buffer) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buffer)
            if len(self._buffer) < HEADER.size + length:
                break
            frames.append(self._buffer[HEADER.size : HEADER.size + length])
            self._buffer = self._buffer[HEADER.size + length :]
        return frames

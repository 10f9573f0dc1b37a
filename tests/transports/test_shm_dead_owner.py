"""A receiver does not keep a killed sender's shared memory mapped (found by the chaos soak:
the server held the unlinked slot pools of every stage process killed under it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from omnictl.messages import ShmRef
from omnictl.transports.shm import SegmentReader, SlotPool

REPO = Path(__file__).resolve().parents[2]
SENDER = """
import json, sys
from omnictl.transports.shm import SlotPool
pool = SlotPool("sender", "s", 1 << 16, 2)
ref, view = pool.acquire(4)
view[:] = b"ping"
print(json.dumps([ref.owner, ref.stage, ref.segment, ref.slot, ref.offset, ref.nbytes]), flush=True)
sys.stdin.read()  # until killed
"""


def _mapped(name: str) -> bool:
    return name in Path("/proc/self/maps").read_text()


def test_the_segments_of_a_killed_sender_are_unmapped_at_the_next_new_segment() -> None:
    sender = subprocess.Popen([sys.executable, "-c", SENDER], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    reader = SegmentReader()
    own = SlotPool("receiver", "r", 1 << 16, 1)
    try:
        assert sender.stdout is not None
        ref = ShmRef(*json.loads(sender.stdout.readline()))
        view = reader.read(ref)
        assert bytes(view) == b"ping"
        view.release()
        assert _mapped(ref.segment)
        sender.send_signal(signal.SIGKILL)
        sender.wait()
        mine, buffer = own.acquire(4)
        buffer[:] = b"pong"
        buffer.release()
        view = reader.read(mine)  # a segment not mapped yet: the dead sender's are dropped first
        assert bytes(view) == b"pong"
        view.release()
        assert not _mapped(ref.segment)
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
        reader.close()
        own.close()


def test_reclaim_takes_back_only_what_went_to_the_dead_process() -> None:
    pool = SlotPool("me", "s", 1024, 2)
    try:
        refs = []
        for size in (8, 8, 4096):  # two slots and a segment of its own
            ref, view = pool.acquire(size)
            view.release()
            refs.append(ref)
        pool.sent(refs[0], "x#0")
        pool.sent(refs[1], "x#1")
        pool.sent(refs[2], "x#0")
        assert pool.in_use == 3
        assert pool.reclaim("x#0") == 2 and pool.in_use == 1
        pool.release(refs[1])  # released by its reader as usual: nothing left to take back
        assert pool.in_use == 0 and pool.reclaim("x#1") == 0
    finally:
        pool.close()

"""The fork template's bookkeeping of its children, in the test process over a real socket
pair and with real child processes, each test well under a second: how a child's end is
reported (its exit code, or minus the signal that killed it) and that one reap reports
every child that ended, and only those. (The template's loop and a forked child's start
run in the template process: tests/coordinator/test_launcher.py starts them for real.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Iterator

import pytest

from omnictl.stage.fork_wire import EXITED, Frames
from omnictl.stage.template import _reap, exit_code


def child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-S", "-c", code])


def ended(process: subprocess.Popen[bytes]) -> None:
    """Wait until ``process`` has ended, leaving it to be reaped (its status stays there)."""
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)


def reaped(process: subprocess.Popen[bytes]) -> None:
    process.returncode = 0  # reaped by the template's code: Popen must not wait for it again


@pytest.fixture()
def control() -> Iterator[tuple[socket.socket, socket.socket]]:
    template_end, launcher_end = socket.socketpair()
    launcher_end.settimeout(2.0)
    yield template_end, launcher_end
    template_end.close()
    launcher_end.close()


def reports(launcher_end: socket.socket, *ours: subprocess.Popen[bytes]) -> list[tuple[bytes, int, int]]:
    """The reports of ``ours`` (the test process may have other children that ended, which a
    reap reports too: every report must name a real child, though)."""
    launcher_end.setblocking(False)
    data = b""
    try:
        while chunk := launcher_end.recv(1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    every = [EXITED.unpack(body) for body in Frames().feed(data)]
    assert all(pid > 0 for _, pid, _ in every), every
    pids = {process.pid for process in ours}
    return sorted(report for report in every if report[1] in pids)


def test_exit_code_is_the_code_or_minus_the_signal() -> None:
    exits = child("raise SystemExit(3)")
    killed = child("import time; time.sleep(30)")
    killed.send_signal(signal.SIGKILL)
    assert exit_code(os.waitpid(exits.pid, 0)[1]) == 3
    assert exit_code(os.waitpid(killed.pid, 0)[1]) == -signal.SIGKILL
    clean = child("pass")
    assert exit_code(os.waitpid(clean.pid, 0)[1]) == 0
    for process in (exits, killed, clean):
        reaped(process)


def test_one_reap_reports_each_child_that_ended_and_leaves_the_running_ones(
        control: tuple[socket.socket, socket.socket]) -> None:
    template_end, launcher_end = control
    first, second = child("raise SystemExit(3)"), child("raise SystemExit(0)")
    running = child("import time; time.sleep(30)")
    try:
        ended(first)
        ended(second)
        _reap(template_end)  # returns while a child still runs (waitpid: nothing more now)
        assert reports(launcher_end, first, second, running) == sorted([(b"X", first.pid, 3), (b"X", second.pid, 0)])
        reaped(first)
        reaped(second)
        _reap(template_end)  # nothing ended since
        assert reports(launcher_end, first, second, running) == []
        running.kill()
        ended(running)
        _reap(template_end)  # the last child: returns once none is left
        assert reports(launcher_end, running) == [(b"X", running.pid, -signal.SIGKILL)]
        reaped(running)
    finally:
        if running.returncode is None:
            running.kill()
            running.wait()

"""The launcher's side of the stage-process template (:mod:`omnictl.stage.template`).

:class:`Template` starts the template process and asks it for children;
:class:`ForkedProcess` is one child, read as the launcher reads a ``subprocess.Popen``
(``pid``, ``poll``, ``returncode``, ``terminate``, ``kill``, ``wait``). A child is the
template's, not this process's: the template reaps it and reports its exit code, and
signals go through a pidfd, so a recycled pid is never signalled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from typing import Callable

from omnictl.stage.fork_wire import EXITED, FORKED, READY, Frames, frame

_FORK_REPLY_TIMEOUT_S = 5.0  # a fork answers in milliseconds; past this the template is taken as stuck
log = logging.getLogger(__name__)


class ForkedProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.why: str | None = None  # how it ended when no exit code is known (its template died)
        self.on_exit: Callable[[], None] | None = None  # called once its exit is known
        try:
            self._pidfd = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone (and reaped): its exit report is on its way
            self._pidfd = -1

    def poll(self) -> int | None:
        return self.returncode

    def wait(self) -> int | None:
        """Its exit code when the template has reported it (it is reaped there, not here)."""
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.returncode is None and self._pidfd >= 0:
            try:
                signal.pidfd_send_signal(self._pidfd, signum)
            except ProcessLookupError:  # it has just exited: the report follows
                pass

    def ended(self, code: int, why: str | None = None) -> None:
        if self.returncode is not None:
            return
        self.returncode, self.why = code, why
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        if self.on_exit is not None:
            self.on_exit()


class Template:
    """One template process for a launch; children are forked from it on :meth:`fork` once
    it is :attr:`ready` (it takes about as long to start as one stage process)."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "omnictl.stage.template", str(theirs.fileno()), str(os.getpid())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        self._socket = ours
        self._frames = Frames()
        self.ready = False
        self.lost = False
        self.children: dict[int, ForkedProcess] = {}
        self._forked: deque[ForkedProcess] = deque()  # forks answered, not yet handed out
        asyncio.get_running_loop().add_reader(ours.fileno(), self._readable)

    def fork(self, config: bytes) -> ForkedProcess:
        """A child running the worker ``config`` describes. Waits for the template's answer
        here (a fork takes milliseconds), so a start stays synchronous as Popen's is. Raises
        OSError when the template is gone or does not answer."""
        self._socket.sendall(frame(config))
        deadline = time.monotonic() + _FORK_REPLY_TIMEOUT_S
        while not self._forked:
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([self._socket], [], [], max(0.0, remaining))
            if not readable:
                self.close()
                raise OSError(f"the stage-process template did not answer a fork in {_FORK_REPLY_TIMEOUT_S:g}s")
            self._readable()
            if self.lost:
                raise OSError("the stage-process template exited")
        return self._forked.popleft()

    def _readable(self) -> None:
        try:
            # never blocking: a fork's wait may have read what made the loop call this
            data = self._socket.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except ConnectionError:
            data = b""
        if not data:
            self._lose()
            return
        for body in self._frames.feed(data):
            kind = body[:1]
            if kind == READY:
                self.ready = True
            elif kind == b"F":
                _, pid = FORKED.unpack(body)
                child = self.children[pid] = ForkedProcess(pid)
                self._forked.append(child)
            elif kind == b"X":
                _, pid, code = EXITED.unpack(body)
                exited = self.children.pop(pid, None)
                if exited is not None:
                    exited.ended(code)

    def _lose(self) -> None:
        """The template exited: its children die with it (they were started so); each is
        killed here too, to be sure, and reported."""
        if self.lost:
            return
        self.lost = True
        self.ready = False
        asyncio.get_running_loop().remove_reader(self._socket.fileno())
        self._socket.close()
        code = self.process.wait()
        if self.children:
            log.error(
                "the stage-process template exited (%s); its %d stage process(es) go with it", code, len(self.children)
            )
        for child in list(self.children.values()):
            child.kill()
            child.ended(-signal.SIGKILL, f"its template process exited (code {code})")
        self.children.clear()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the template (its children are stopped first, by the launcher)."""
        if self.lost:
            return
        self.lost = True
        self.ready = False
        asyncio.get_running_loop().remove_reader(self._socket.fileno())
        self._socket.close()  # it exits when it reads the end of its socket
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

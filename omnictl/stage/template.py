"""A preloaded template process that forks stage processes (the launcher's fast start).

A stage process started as a fresh interpreter spends most of its start-up importing
(``python -m omnictl.stage.worker``: about 1 s of a core here, 2 s and more while the cores
are busy), which is what an autoscaler's new replica waits for. This process imports the
worker's modules once, then forks one child per request: a child starts with them already
imported and runs the worker from its configuration at once (as multiprocessing's
forkserver with a preload does).

It preloads omnictl's own modules only (zmq, msgspec, numpy), never a topology's factories:
those may start threads (torch's pools) or hold accelerator state, which a fork does not
carry over. No thread runs here before a fork, and no zmq context exists here.

The wire, over the socket the launcher passes (file descriptor ``argv[1]``): frames of a
4-byte length and a body. To the template: a worker configuration (``encode_config``'s
bytes) to fork a child for. From it: ``R`` once it has preloaded; ``F`` + pid for each
fork, in request order; ``X`` + pid + exit code (negative: the signal) for each child that
ended. When the socket closes (the launcher stopped), it exits; its children, which die
with their parent, follow.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import sys
import traceback

from omnictl.stage.fork_wire import EXITED, FORKED, READY, Frames, frame


def exit_code(status: int) -> int:
    """``waitpid``'s status as subprocess reports it: the exit code, or minus the signal."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    parent_pid = int(sys.argv[2])
    from omnictl.stage import worker  # the preload: what every child would import

    worker.die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    # SIGCHLD wakes the select below through this pipe (the handler itself does nothing)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    # what the preload allocated is never collected here: a child's collector leaves those
    # pages shared instead of touching (copying) them all on its first collection
    gc.freeze()
    control.sendall(frame(READY))
    frames = Frames()
    while True:
        try:
            readable, _, _ = select.select([control.fileno(), wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(control)
        if control.fileno() in readable:
            data = control.recv(1 << 20)
            if not data:  # the launcher closed its end: it has stopped
                return
            for config in frames.feed(data):
                pid = os.fork()
                if pid == 0:  # the child: it never returns from here
                    _child(config, control, (wake_r, wake_w), parent_pid=os.getppid())
                control.sendall(frame(FORKED.pack(b"F", pid)))


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no child left
            return
        if pid == 0:
            return
        control.sendall(frame(EXITED.pack(b"X", pid, exit_code(status))))


def _child(config: bytes, control: socket.socket, wake: tuple[int, int], parent_pid: int) -> None:
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        control.close()  # the launcher's channel is the template's, not this worker's
        for fd in wake:
            os.close(fd)
        from omnictl.stage import worker

        worker.serve(config, parent_pid=parent_pid)
        code = 0
    except BaseException:  # what a fresh interpreter would print before exiting 1
        traceback.print_exc()
    finally:
        os._exit(code)  # never back into the template's loop


if __name__ == "__main__":
    main()

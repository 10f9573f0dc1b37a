"""One OS process of a pipeline: builds its stages, then UNPACKs and dispatches.

Started by the launcher (``omnictl.coordinator.launcher``) as a fresh interpreter
(``python -m omnictl.stage.worker``), or forked from its preloaded template
(:mod:`omnictl.stage.template`) for a replica the autoscaler adds. The process exits on its
own when its parent dies (PR_SET_PDEATHSIG plus a parent-pid watch), and unlinks the shared
memory it owns on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from omnictl import logs
from omnictl import messages as m
from omnictl.exceptions import ResolveError, StartupError, describe_error
from omnictl.profiling.events import EventKind, NullProfiler, Profiler
from omnictl.stage.build import build_stage
from omnictl.stage.ports import WorkerPorts
from omnictl.stage.stage import Stage
from omnictl.stage.startup import WorkerConfig, decode_config
from omnictl.transports.drain import Drain
from omnictl.transports.endpoint import Broadcasts, Endpoint, resolve_data_host
from omnictl.transports.leases import ViewLeases
from omnictl.transports.shm import SegmentReader

_PR_SET_PDEATHSIG = 1
_REPORT_LINGER_MS = 2000  # how long a stage process that failed to start waits for its report to go out
log = logging.getLogger("omnictl.stage.worker")  # not __name__: it runs as __main__
# How often inboxes are checked besides their events (Stage.check_inbox): a scheduler may
# take from its inbox without an output, e.g. into a batch that runs a long prefill.
_INBOX_POLL_S = 0.02


def die_with_parent(parent_pid: int) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the parent-pid watch below still covers it
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def main() -> None:
    """Process entry point: the launcher writes the WorkerConfig (msgpack, typed) to stdin."""
    serve(sys.stdin.buffer.read())


def serve(data: bytes, parent_pid: int | None = None) -> None:
    """Run the worker the encoded configuration ``data`` describes until it is stopped, then
    exit. ``parent_pid``: the process it dies with when not the configuration's (a child
    forked by :mod:`omnictl.stage.template` dies with the template)."""
    config = decode_config(data)
    if parent_pid is not None:
        config = dataclasses.replace(config, parent_pid=parent_pid)
    logs.configure_stage_process(
        config.log_level,
        config.log_format,  # type: ignore[arg-type]  # checked there
        config.instance,
        Path(config.log_file) if config.log_file else None,
    )
    sys.path[:] = [*dict.fromkeys([*config.sys_path, *sys.path])]
    die_with_parent(config.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    with contextlib.suppress(SystemExit):  # a SIGTERM while the stages loaded (_exit_on_sigterm)
        asyncio.run(Worker(config).run())
    # Don't wait for stage worker threads still inside a model call: everything this
    # process owns (shared memory, sockets) was released in Worker.run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM before the stages are built: exit now (SystemExit, unwinding the factory's
    ``finally`` blocks), not when the factories return. The event loop that would hear it
    is blocked in a factory, a model may take minutes to load, and the launcher stopping a
    launch (a ready timeout, Ctrl-C) would wait its 5 s and SIGKILL."""
    raise SystemExit(0)


def _make_profiler(config: WorkerConfig) -> tuple[Profiler, Any]:
    if config.profile_address is None:
        return NullProfiler(), None
    from omnictl.profiling.recorder import Recorder

    recorder = Recorder(config.instance, config.profile_address, curve=config.curve)
    return recorder, recorder


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.stages: dict[str, Stage] = {}
        self.reader = SegmentReader()
        self._stop = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        # A Ray actor or a thread (launcher="threads"): no signals there; stop() instead.
        if threading.current_thread() is not threading.main_thread():
            await self._serve()
            return
        # Until the stages are built a SIGTERM exits at once (see _exit_on_sigterm); then the
        # loop hears it (_serve) and the worker shuts down cleanly.
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            await self._serve()
        finally:
            # Now, not when asyncio.run closes the loop: that closes the loop's wake-up pipe
            # first, and a SIGTERM between the two (the launcher stopping a process whose
            # stage failed to build) prints "Exception ignored ... signal wakeup fd" into
            # the operator's terminal.
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, previous)

    async def _serve(self) -> None:
        config = self.config
        self.endpoint = endpoint = Endpoint(
            config.instance,
            config.topology.wire_layout(),
            ipc_addresses=config.process_addresses,
            node=config.node,
            curve=config.curve,
        )
        # none under Ray: every address is tcp
        inbound = endpoint.pull(config.process_addresses.get(config.instance))
        tcp_address = ""
        if config.curve is not None:  # take tcp data too, on the data host
            host = resolve_data_host(config.data_host, "ray")  # None: $OMNICTL_DATA_HOST, else its Ray node's address
            tcp_address = endpoint.bind_tcp(inbound, host, config.tcp_port)
        broadcasts = endpoint.broadcasts(config.broadcast_address)
        profiler, recorder = _make_profiler(config)
        self.ports = WorkerPorts(endpoint, config.topology, config.coordinator_address, profiler)
        self.leases = ViewLeases(self.reader, self.ports.release)
        try:
            built = await self._build(profiler)
        except SystemExit:  # a SIGTERM while loading: give back the sockets and memory made so far
            self._close(recorder)
            raise
        if not built:
            # the LaunchFailed report is queued: without a linger, closing would drop it and
            # the coordinator would only see the process exit, not why
            self._close(recorder, linger_ms=_REPORT_LINGER_MS)
            return
        if threading.current_thread() is threading.main_thread():  # a process of its own (see run)
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._stop.set)
        self.ports.send_control(m.Ready(config.instance, os.getpid(), tcp_address))
        drain = Drain(inbound, m.inbound_decoder.decode, self._receive, f"stage process {config.instance}")
        tasks = [
            asyncio.create_task(self._listen(broadcasts)),
            asyncio.create_task(self._watch_inboxes()),
        ]
        if config.parent_pid:  # 0: a Ray actor (Ray manages its life) or a thread of the launching process
            tasks.append(asyncio.create_task(self._watch_parent()))
        await self._stop.wait()
        drain.close()
        for task in tasks:
            task.cancel()
        for stage in self.stages.values():
            await stage.stop()
        self._close(recorder)

    def stop(self) -> None:
        """Shut down cleanly (what SIGTERM does for a worker that is an OS process of its own)."""
        self._stop.set()

    async def _build(self, profiler: Profiler) -> bool:
        config = self.config
        for name in config.topology.processes[config.process].stages:
            spec = config.topology.stages[name]
            started = time.monotonic()
            try:
                stage = build_stage(spec, config.topology, config.model_path, self.ports, profiler, config.audio_policy)
                await stage.start()
            except (ResolveError, StartupError) as exc:  # one line: which module / option, and why
                self.ports.send_control(m.LaunchFailed(config.instance, name, str(exc)))
                return False
            except SystemExit:  # a SIGTERM while loading (_exit_on_sigterm): no failure to report
                raise
            except BaseException:  # report any failure to build, with its traceback
                self.ports.send_control(
                    m.LaunchFailed(config.instance, name, "its factory raised\n" + traceback.format_exc())
                )
                return False
            self.stages[name] = stage
            self.ports.local[name] = stage
            stage.on_inbox = self._inbox_state
            stage.on_input_taken = self._input_taken
            log.info("stage %r loaded in %.1f s (process %s)", name, time.monotonic() - started, config.process)
        return True

    def _close(self, recorder: Any, linger_ms: int = 0) -> None:
        self.leases.close()
        self.endpoint.close(linger_ms)
        self.reader.close()
        if recorder is not None:
            recorder.close()

    async def _watch_parent(self) -> None:
        while os.getppid() == self.config.parent_pid:
            await asyncio.sleep(0.5)
        self._stop.set()

    def _receive(self, message: m.StageInbound, frames: list[memoryview]) -> None:
        try:
            self._dispatch(message, frames)
        except Exception as exc:
            # One message that cannot be handled fails its request, not the process.
            request_id = message.ctx.request_id if hasattr(message, "ctx") else None
            if request_id is None:
                raise
            stage = getattr(message, "dst", self.config.instance)
            why = f"stage {stage!r} could not take its input: {describe_error(exc)}"
            log.error("%s", why, exc_info=exc, extra={"request_id": request_id})
            self.ports.send_failure(request_id, stage, why, rejected=True)

    # Backpressure. A full inbox is not enforced by not reading the inbound socket: one
    # socket carries both new requests and what running ones still need (stream chunks,
    # a streamed request's final input, slot releases), so not reading it can deadlock a
    # stage whose queued requests wait for its running ones. Instead the stage tells the
    # coordinator, which admits no new request while any stage is full (Admission.hold):
    # the queue stops growing at the door, and everything inside keeps flowing.
    def _inbox_state(self, stage: str, full: bool) -> None:
        self.ports.send_control(m.InboxState(self.config.instance, stage, full))

    def _input_taken(self, stage: str, request_id: str, taken: int) -> None:
        self.ports.send_control(m.InputTaken(self.config.instance, stage, request_id, taken))

    async def _watch_inboxes(self) -> None:
        while True:
            await asyncio.sleep(_INBOX_POLL_S)
            for stage in self.stages.values():
                stage.check_inbox()

    def _unpack(self, payload: m.EncodedPayload, frames: list[memoryview]) -> Any:
        """Tensors arrive as views of the sender's slot (released when they are freed) or
        of their tcp frames."""
        return self.leases.decode(payload, self.config.topology.allow_pickle, frames)

    def _dispatch(self, message: m.StageInbound, frames: list[memoryview]) -> None:
        if isinstance(message, m.SlotRelease):
            self.ports.pool(message.ref.stage).release(message.ref)
            return
        stage = self.stages[message.dst]
        if isinstance(message, m.Submit):
            stage.on_input(message.ctx, None, self._unpack(message.payload, frames))
        elif isinstance(message, m.DataReady):
            data = self._unpack(message.payload, frames)
            stage.profiler.record(
                EventKind.HOP_RECEIVED,
                message.ctx.request_id,
                stage.name,
                source=message.src,
                transport=self.config.topology.edge(message.src, message.dst).transport.value,
            )
            stage.on_input(message.ctx, message.src, data)
        elif isinstance(message, m.StreamChunk):
            stage.on_stream_chunk(message.ctx, message.src, message.seq, self._unpack(message.payload, frames))
        elif isinstance(message, m.StreamDone):
            stage.on_stream_done(message.ctx, message.src)
        elif isinstance(message, m.Skip):
            stage.on_skip(message.ctx, message.src)

    async def _listen(self, broadcasts: Broadcasts) -> None:
        while True:
            message = m.broadcast_decoder.decode(await broadcasts.next())
            if isinstance(message, m.Abort):
                for request_id in message.request_ids:
                    for stage in self.stages.values():
                        stage.on_abort(request_id)
            elif isinstance(message, m.ProcessLost):
                self.ports.lost(message.process)
                self.reader.drop_dead()  # unmap its segments: they were unlinked, their memory is held here
            elif isinstance(message, m.Hello):
                self.ports.set_tcp_addresses(message.tcp_addresses)
                self.ports.send_control(m.HelloAck(self.config.instance, message.seq))
            elif isinstance(message, m.StatsRequest):
                stats = {
                    name: stage.stats(self.ports.pools[name].in_use if name in self.ports.pools else 0)
                    for name, stage in self.stages.items()
                }
                self.ports.send_control(m.StatsReply(self.config.instance, message.seq, stats))


if __name__ == "__main__":
    main()

"""The public Python API: launch a topology, submit requests, abort, inspect."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generator, Iterable, Sequence

from omnictl import logs
from omnictl.admission import Admission
from omnictl.coordinator import socketdir
from omnictl.coordinator.coordinator import Coordinator
from omnictl.coordinator.request import RequestHandle
from omnictl.coordinator.wiring import Wiring
from omnictl.exceptions import StartupError
from omnictl.inputs import request_params
from omnictl.launch_config import LaunchConfig, LaunchOptions
from omnictl.topology.derive import on_cpu
from omnictl.topology.model import Topology

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11


def _load(topology: str | Path | Topology, device: str | None) -> Topology:
    if isinstance(topology, Topology):
        loaded = on_cpu(topology) if device == "cpu" else topology
    else:
        from omnictl.topology import load

        # a misspelt factory fails here, at its own line, before any process loads a model
        loaded = load(topology, device=device, find_imports=True)
    return loaded


class Pipeline:
    """A running topology. Create it with :meth:`Pipeline.launch`."""

    def __init__(
        self, coordinator: Coordinator, collector: Any | None, recorder: Any | None, run_dir: Path | None
    ) -> None:
        self._coordinator = coordinator
        self._collector = collector
        self._recorder = recorder
        self.run_dir = run_dir
        config = coordinator.config
        self.admission = Admission.of(config.admission)  # the one every entry point calls
        self.otlp_endpoint = config.profiling.otlp_endpoint  # where finished requests' traces go; None: off
        self._log_file: logging.Handler | None = None  # the server's records in <run_dir>/logs/server.log
        coordinator.on_backpressure = self._backpressure

    @classmethod
    def launch(
        cls, topology: str | Path | Topology, config: LaunchConfig | None = None, **options: Unpack[LaunchOptions]
    ) -> _Launch:
        """Spawn the stage processes; use as ``async with`` (or ``await`` it and close yourself).

        The knobs come as one :class:`~omnictl.launch_config.LaunchConfig`, or by keyword
        (``Pipeline.launch(path, device="cpu")``, the flat names of
        :class:`~omnictl.launch_config.LaunchOptions`); keywords given beside a config replace
        its fields.

        ``device="cpu"`` drops the GPU placement (processes stay as declared; a stage with
        ``tp_size`` N runs its N ranks on the CPU). User code (factories, route/merge
        functions, projections) is imported with the topology file's directory first on
        the import path.
        ``max_restarts`` > 0 restarts a stage process (each replica on its own) that dies;
        otherwise it stays down: requests go to the process's other replicas, and once a
        process has none left the pipeline refuses new work. ``replay_limit`` (default 1):
        how often a request pinned to a process that died, whose caller had seen no output
        yet, is re-run from the entry on a live (or the restarted) replica before it fails
        naming the stage (0: it fails with the process). ``profile`` records every request
        stage by stage into ``run_dir`` (a fresh directory under the user state dir by default);
        with a run directory, every stage process's log records also go to ``run_dir/logs/``
        (``NAME.log`` or ``NAME#i.log``), and this process's to ``server.log`` once
        :func:`omnictl.logs.configure` was called.
        ``max_in_flight`` (None: no limit) and ``max_queue_wait`` are admission control (see
        :mod:`omnictl.admission`): ``submit`` raises :class:`Overloaded` over the limit.
        ``otlp_endpoint`` (an OTLP/HTTP collector's URL, e.g. ``http://127.0.0.1:4318``; None:
        off) exports every finished request as an OpenTelemetry trace built from its profile
        (needs ``profile``; see :mod:`omnictl.telemetry`).
        ``launcher="ray"`` runs each process replica as a Ray actor on a node whose
        ``omnictl-node`` label is its process's `node` (unlabelled: this machine), joining the
        cluster at ``ray_address`` (None: Ray's default: a running local cluster, or a new one).
        ``launcher="threads"`` runs each as a thread of this process instead (tests,
        debugging, notebooks: no interpreter to start, but no process boundary either; see
        :mod:`omnictl.coordinator.thread_launcher`).
        ``data_host``: the address tcp sockets bind and advertise (default ``$OMNICTL_DATA_HOST``).
        ``input_window`` (default 64) and ``input_wait`` (default 30 s): a streamed input's
        backpressure (see :meth:`RequestHandle.send`).
        ``audio_policy``: how stages making audio for several streams pick the next,
        ``"fifo"`` or ``"deadline"`` (see :mod:`omnictl.playback.policy`); a stage factory
        that takes an ``audio_policy`` argument is given it.
        """
        config = config or LaunchConfig()
        if options:  # each part checks its values as it is made: before any process starts
            config = config.replace(**options)
        profiling = config.profiling
        if profiling.otlp_endpoint is not None:
            from omnictl.telemetry.endpoint import check_installed, traces_url

            if not profiling.profile:
                raise StartupError(
                    "otlp_endpoint needs profile=True", hint="traces are built from the profiler's events"
                )
            config = config.replace(otlp_endpoint=traces_url(profiling.otlp_endpoint))
            check_installed()
        loaded = _load(topology, config.device)
        return _Launch(cls, loaded, config)

    @classmethod
    async def _start(cls, topology: Topology, config: LaunchConfig) -> Pipeline:
        collector = None
        profiling = config.profiling
        run_dir = profiling.run_dir
        profiler = None
        # owner-only (sweeps those of killed servers); the keys when any socket is tcp, shared
        # by the coordinator, the collector and the launcher
        wiring = Wiring.resolve(topology, config, socketdir.create(), profiling=profiling.profile)
        if profiling.profile:
            from omnictl.profiling.collector import Collector
            from omnictl.profiling.rundir import default_run_dir, write_run_info

            if run_dir is None:
                run_dir = default_run_dir()
                # debug here: omnictl.run() says it at INFO (a script's caller chose nothing), and
                # serve and bench say their run folder in their own output
                log.debug("recording this run's traces and logs in %s", run_dir)
            write_run_info(run_dir, topology)
            otlp = None
            if profiling.otlp_endpoint is not None:
                from omnictl.telemetry.endpoint import OtlpTarget, sink_spec

                otlp = sink_spec(OtlpTarget(profiling.otlp_endpoint, topology.name, dict(topology.terminals)))
            address = wiring.profile_address
            assert address is not None  # resolved with profiling on
            if wiring.curve is not None:  # workers on other nodes ship their events over tcp, authenticated
                collector = Collector(
                    run_dir, address, sink=otlp, tcp_host=wiring.data_host, curve=wiring.curve
                ).start()
                wiring = wiring.with_tcp(profile=collector.tcp_address)
            else:
                collector = Collector(run_dir, address, sink=otlp).start()
            profiler = collector.local_recorder()
        config = config.replace(run_dir=run_dir)  # the one it runs in, made above when profiling
        coordinator = Coordinator(topology, config, wiring, profiler=profiler)
        pipeline = cls(coordinator, collector, profiler, run_dir)
        if run_dir is not None and logs.configured():
            pipeline._log_file = logs.attach_file(logs.log_file(run_dir, logs.SERVER_LOG))
        try:
            await coordinator.start()
        except BaseException:
            await pipeline.close()
            raise
        return pipeline

    @property
    def topology(self) -> Topology:
        return self._coordinator.topology

    @property
    def healthy(self) -> bool:
        """Every replica of every stage process is up."""
        return self._coordinator.healthy

    def health(self) -> tuple[str, dict[str, str]]:
        """``("ok" | "degraded" | "down", {replica: why it is down})``: degraded while every
        process still has a replica up, down when some process has none."""
        return self._coordinator.health()

    def scaling(self) -> dict[str, dict[str, int]]:
        """Per elastic process (`replicas: {min, max}`): ``replicas`` running now, and the
        autoscaler's decisions so far (``scaled_up``, ``scaled_down``)."""
        return self._coordinator.scaling()

    @property
    def resumed(self) -> int:
        """Of the replays, the streams resumed with the tokens their caller had forced."""
        return self._coordinator.core.resumed

    @property
    def standby(self) -> frozenset[str]:
        """The replicas of elastic processes not running now (started when load rises)."""
        return frozenset(self._coordinator.core.standby)

    @property
    def replayed(self) -> int:
        """Requests re-run from the entry after a process they were pinned to died (each
        replay counts once)."""
        return self._coordinator.core.replayed

    @property
    def recorder(self) -> Any | None:
        """The profiler's recorder in this process (None when profiling is off): events the
        server itself sees, such as an audio stream's underrun, go into the same traces."""
        return self._recorder

    @property
    def profile(self) -> Any | None:
        """The profiling collector (aggregates and trace store), or None when off."""
        return self._collector

    async def submit(
        self,
        inputs: Any,
        modalities: Sequence[str] | None = None,
        request_id: str | None = None,
        traceparent: str | None = None,
        stream: bool = True,
        input_stream: bool = False,
    ) -> RequestHandle:
        """Start a request. ``modalities`` selects terminals by modality (None: all).

        ``inputs`` reach the entry stage as given: any data tree, or a chat request (an
        :class:`omnictl.inputs.ChatRequest` or its ``{"messages", "sampling", "voice"}`` dict).
        Its ``sampling`` and ``voice`` are also what every stage sees as the request's params.
        Raises :class:`Overloaded` (or :class:`AdmissionTimeout` after waiting) when admission
        control refuses it; the slot it takes is freed when the request ends, however it ends.
        ``traceparent`` (a W3C header value) makes the request's exported trace a child of the
        caller's span; ignored when the pipeline exports no traces, or when it is malformed.
        ``stream`` False: the caller reads only the results (it ignores stream events), so a
        replay after a replica died stays possible until the request completes (True: only
        until its first stream chunk or result).

        ``input_stream`` True: the input arrives over time. The request is open at once;
        the caller sends each chunk with ``await handle.send(chunk)`` and ends the input with
        ``await handle.end_input()``. The entry stage gets them as stream chunks then a
        stream end (``stream_chunk`` / ``stream_done`` in its scheduler's inbox), in order,
        exactly as a ``stream_to`` edge delivers them; ``inputs``, unless None, is the first
        chunk (and gives the request's params, as above). The chunks go from this process to
        the entry stage over the data plane, never through the coordinator's control
        messages. An abort, a failure or the request's deadline (``request_timeout``, which
        a caller that never ends its input runs into) ends it everywhere. A replica's death
        replays it as a whole input would be (``replay_limit``): the chunks sent so far are
        kept until its caller sees output, and sent again, in order, to the new attempt.
        """
        params = request_params(inputs)
        trace_parent = None
        if traceparent is not None and self.otlp_endpoint is not None:
            from omnictl.telemetry.traceparent import parse_traceparent

            trace_parent = parse_traceparent(traceparent)
        ticket = await self.admission.admit()
        try:
            handle = await self._coordinator.submit(
                inputs,
                modalities,
                request_id,
                params=params,
                trace_parent=trace_parent,
                stream=stream,
                input_stream=input_stream,
            )
        except BaseException:
            ticket.release()
            raise
        handle.on_done(ticket.release)
        return handle

    def avoid(self, instances: Iterable[str]) -> None:
        """Pin no new request to these OS processes (replicas up but not answering: `/health`'s
        ``unresponsive``) while another replica of theirs can take it; replaces the last call's set."""
        self._coordinator.unresponsive = frozenset(instances)

    def _backpressure(self, full: bool) -> None:
        """Some stage's inbox filled up (or all have room again): admission holds (resumes)."""
        self.admission.hold(full)

    async def abort(self, request_id: str) -> None:
        await self._coordinator.abort(request_id)

    async def stats(self, timeout: float = 5.0) -> dict[str, dict[str, Any]]:
        """Per stage: ``status`` (up/down/unknown), ``process``, and how many requests it
        holds state for, by kind (fan-in buffers, queued, running, stream buffers, KV
        slots, shared-memory slots in use)."""
        return await self._coordinator.stats(timeout)

    async def held(self, timeout: float = 5.0) -> dict[str, dict[str, Any]]:
        """Everything the pipeline holds for requests, by where; every figure is 0 once every
        request has ended. ``coordinator``: request records, requests pinned to replicas,
        in-flight counts over the replicas, its own shared-memory slots (entry inputs);
        ``admission``: slots in flight and callers waiting; ``stages``: each stage's
        per-request state from :meth:`stats` (requests, queued, running, fan-in and stream
        buffers, KV and shared-memory slots), summed over its replicas (a stage that did
        not answer within ``timeout`` shows ``unknown``)."""
        stats = await self.stats(timeout)
        stages: dict[str, Any] = {}
        for name, entry in stats.items():
            if entry["status"] == "unknown":
                stages[name] = {"unknown": 1}
                continue
            stages[name] = {
                key: value
                for key, value in entry.items()
                if key not in ("status", "process", "replicas", "node", "busy_s")
            }
        return {
            "coordinator": self._coordinator.held(),
            "admission": {"in_flight": self.admission.in_flight, "queued": self.admission.queued},
            "stages": stages,
        }

    def nodes(self) -> dict[str, dict[str, Any]]:
        """Per `node` label (``-``: this machine): ``status`` (up/degraded/down) and the OS
        processes placed there."""
        return self._coordinator.nodes()

    def process_ids(self) -> dict[str, int]:
        """OS pid of each stage process, by its name (``NAME#i`` for a replica)."""
        return {name: h.pid for name, h in self._coordinator.launcher.handles.items()}

    @property
    def socket_dir(self) -> Path:
        """Where this pipeline's ZeroMQ sockets live (removed on close)."""
        return self._coordinator.socket_dir

    def in_flight(self) -> int:
        return len(self._coordinator.requests)

    async def close(self) -> None:
        await self._coordinator.close()
        if self._recorder is not None:
            self._recorder.close()
        if self._collector is not None:
            self._collector.close()
        if self._log_file is not None:
            logs.detach(self._log_file)
            self._log_file = None


class _Launch:
    def __init__(self, cls: type[Pipeline], topology: Topology, config: LaunchConfig) -> None:
        self._cls = cls
        self._topology = topology
        self.config = config
        self._pipeline: Pipeline | None = None

    def __await__(self) -> Generator[Any, None, Pipeline]:
        return self._cls._start(self._topology, self.config).__await__()

    async def __aenter__(self) -> Pipeline:
        self._pipeline = await self._cls._start(self._topology, self.config)
        return self._pipeline

    async def __aexit__(self, *exc_info: object) -> None:
        if self._pipeline is not None:
            await self._pipeline.close()


def run(
    topology: str | Path | Topology,
    inputs: dict[str, Any],
    modalities: Sequence[str] | None = None,
    **launch_options: Unpack[LaunchOptions],
) -> dict[str, Any]:
    """Launch, run one request, shut down: ``{terminal_stage: data}``. For scripts.

    Like :meth:`Pipeline.launch`, it profiles the request by default and so writes a run
    directory: ``<user state dir>/runs/<YYYYmmdd-HHMMSS-pid>`` (``platformdirs``'
    ``user_state_dir("omnictl")``; the newest ten such runs are kept), logged at INFO on the
    ``omnictl.pipeline`` logger; ``omnictl trace --last 5`` lists its request there.
    ``profile=False`` writes none; ``run_dir=`` names the directory to use instead."""

    async def once() -> dict[str, Any]:
        async with Pipeline.launch(topology, **launch_options) as pipe:
            if pipe.run_dir is not None and launch_options.get("run_dir") is None:
                # said, since nobody asked for it: profile=False records nothing, run_dir= chooses
                log.info(
                    "recording this run's traces and logs in %s (profile=False: none; run_dir=: elsewhere)",
                    pipe.run_dir,
                )
            request = await pipe.submit(inputs, modalities)
            return await request.result()

    return asyncio.run(once())

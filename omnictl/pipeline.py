"""The public Python API: launch a topology, submit requests, abort, inspect."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Generator, Iterable, Sequence

from omnictl import logs
from omnictl.admission import Admission
from omnictl.coordinator import socketdir
from omnictl.coordinator.coordinator import Coordinator, resolve_data_host
from omnictl.transports.curve import CurveKeys
from omnictl.coordinator.launcher import refuse_unsupported
from omnictl.coordinator.request import RequestHandle
from omnictl.exceptions import StartupError
from omnictl.inputs import request_params
from omnictl.topology.derive import on_cpu
from omnictl.topology.model import Topology


def _load(topology: str | Path | Topology, device: str | None) -> Topology:
    if isinstance(topology, Topology):
        loaded = on_cpu(topology) if device == "cpu" else topology
    else:
        from omnictl.topology import load

        loaded = load(topology, device=device)
    refuse_unsupported(loaded)  # before any process is spawned
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
        self.admission = Admission(max_in_flight=None)  # launch() sets the limit it was given
        self.otlp_endpoint: str | None = None  # where finished requests' traces go; None: off
        self._log_file: logging.Handler | None = None  # the server's records in <run_dir>/logs/server.log
        coordinator.on_backpressure = self._backpressure

    @classmethod
    def launch(
        cls,
        topology: str | Path | Topology,
        *,
        model_path: str | None = None,
        device: str | None = None,
        run_dir: str | Path | None = None,
        profile: bool = True,
        request_timeout: float = 300.0,
        ready_timeout: float = 120.0,
        max_restarts: int = 0,
        max_in_flight: int | None = None,
        max_queue_wait: float = 0.0,
        otlp_endpoint: str | None = None,
        launcher: str = "local",
        ray_address: str | None = None,
        data_host: str | None = None,
    ) -> "_Launch":
        """Spawn the stage processes; use as ``async with`` (or ``await`` it and close yourself).

        ``device="cpu"`` drops the GPU placement (processes stay as declared). A stage with
        ``tp_size`` > 1 raises :class:`LaunchError` here (tensor parallelism is not
        implemented yet), before any process starts. User code (factories, route/merge
        functions, projections) is imported with the topology file's directory first on
        the import path.
        ``max_restarts`` > 0 restarts a stage process (each replica on its own) that dies;
        otherwise it stays down: requests go to the process's other replicas, and once a
        process has none left the pipeline refuses new work. ``profile`` records every request
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
        ``data_host``: the address tcp sockets bind and advertise (default ``$OMNICTL_DATA_HOST``).
        """
        admission = Admission(max_in_flight, max_queue_wait)  # checks the values before any process starts
        traces_to = None
        if otlp_endpoint is not None:
            from omnictl.telemetry.endpoint import check_installed, traces_url

            if not profile:
                raise StartupError("otlp_endpoint needs profile=True", hint="traces are built from the profiler's events")
            traces_to = traces_url(otlp_endpoint)
            check_installed()
        loaded = _load(topology, device)
        return _Launch(
            cls,
            loaded,
            dict(
                model_path=model_path,
                run_dir=Path(run_dir) if run_dir is not None else None,
                profile=profile,
                request_timeout=request_timeout,
                ready_timeout=ready_timeout,
                max_restarts=max_restarts,
                admission=admission,
                otlp_endpoint=traces_to,
                launcher=launcher,
                ray_address=ray_address,
                data_host=data_host,
            ),
        )

    @classmethod
    async def _start(cls, topology: Topology, options: dict[str, Any]) -> "Pipeline":
        collector = None
        run_dir: Path | None = options["run_dir"]
        profiler = None
        profile_address = None
        socket_dir = socketdir.create()  # owner-only; sweeps those of killed servers
        # the launch's CurveZMQ keys, when any socket is tcp (shared by coordinator and collector)
        curve = CurveKeys.generate() if topology.multi_node() or options["launcher"] == "ray" else None
        if options["profile"]:
            from omnictl.profiling.collector import Collector
            from omnictl.profiling.rundir import default_run_dir, write_run_info

            run_dir = run_dir or default_run_dir()
            write_run_info(run_dir, topology)
            profile_address = f"ipc://{socket_dir}/profile"
            otlp = None
            if options["otlp_endpoint"] is not None:
                from omnictl.telemetry.endpoint import OtlpTarget

                otlp = OtlpTarget(options["otlp_endpoint"], topology.name, dict(topology.terminals))
            if curve is not None:  # workers on other nodes ship their events over tcp, authenticated
                tcp_host = resolve_data_host(options["data_host"], options["launcher"])
                collector = Collector(run_dir, profile_address, otlp=otlp, tcp_host=tcp_host, curve=curve).start()
            else:
                collector = Collector(run_dir, profile_address, otlp=otlp).start()
            profiler = collector.local_recorder()
        coordinator = Coordinator(
            topology,
            model_path=options["model_path"],
            profiler=profiler,
            profile_address=profile_address,
            request_timeout=options["request_timeout"],
            ready_timeout=options["ready_timeout"],
            max_restarts=options["max_restarts"],
            socket_dir=socket_dir,
            run_dir=run_dir,
            launcher=options["launcher"],
            ray_address=options["ray_address"],
            data_host=options["data_host"],
            curve=curve,
            profile_tcp_address=collector.tcp_address if collector is not None else None,
        )
        pipeline = cls(coordinator, collector, profiler, run_dir)
        pipeline.admission = options["admission"]
        pipeline.otlp_endpoint = options["otlp_endpoint"]
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
    ) -> RequestHandle:
        """Start a request. ``modalities`` selects terminals by modality (None: all).

        ``inputs`` reach the entry stage as given: any data tree, or a chat request (an
        :class:`omnictl.inputs.ChatRequest` or its ``{"messages", "sampling", "voice"}`` dict).
        Its ``sampling`` and ``voice`` are also what every stage sees as the request's params.
        Raises :class:`Overloaded` (or :class:`AdmissionTimeout` after waiting) when admission
        control refuses it; the slot it takes is freed when the request ends, however it ends.
        ``traceparent`` (a W3C header value) makes the request's exported trace a child of the
        caller's span; ignored when the pipeline exports no traces, or when it is malformed.
        """
        params = request_params(inputs)
        trace_parent = None
        if traceparent is not None and self.otlp_endpoint is not None:
            from omnictl.telemetry.traceparent import parse_traceparent

            trace_parent = parse_traceparent(traceparent)
        ticket = await self.admission.admit()
        try:
            handle = await self._coordinator.submit(inputs, modalities, request_id, params=params,
                                                    trace_parent=trace_parent)
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
    def __init__(self, cls: type[Pipeline], topology: Topology, options: dict[str, Any]) -> None:
        self._cls = cls
        self._topology = topology
        self._options = options
        self._pipeline: Pipeline | None = None

    def __await__(self) -> Generator[Any, None, Pipeline]:
        return self._cls._start(self._topology, self._options).__await__()

    async def __aenter__(self) -> Pipeline:
        self._pipeline = await self._cls._start(self._topology, self._options)
        return self._pipeline

    async def __aexit__(self, *exc_info: object) -> None:
        if self._pipeline is not None:
            await self._pipeline.close()


def run(
    topology: str | Path | Topology,
    inputs: dict[str, Any],
    modalities: Sequence[str] | None = None,
    **launch_options: Any,
) -> dict[str, Any]:
    """Launch, run one request, shut down: ``{terminal_stage: data}``. For scripts."""

    async def once() -> dict[str, Any]:
        async with Pipeline.launch(topology, **launch_options) as pipe:
            request = await pipe.submit(inputs, modalities)
            return await request.result()

    return asyncio.run(once())

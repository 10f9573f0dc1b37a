"""The public Python API: launch a topology, submit requests, abort, inspect."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Generator, Sequence

from omnictl.admission import Admission
from omnictl.coordinator import socketdir
from omnictl.coordinator.coordinator import Coordinator
from omnictl.coordinator.launcher import refuse_unsupported
from omnictl.coordinator.request import RequestHandle
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
        stage by stage into ``run_dir`` (a fresh directory under the user state dir by default).
        ``max_in_flight`` (None: no limit) and ``max_queue_wait`` are admission control (see
        :mod:`omnictl.admission`): ``submit`` raises :class:`Overloaded` over the limit.
        """
        admission = Admission(max_in_flight, max_queue_wait)  # checks the values before any process starts
        return _Launch(
            cls,
            _load(topology, device),
            dict(
                model_path=model_path,
                run_dir=Path(run_dir) if run_dir is not None else None,
                profile=profile,
                request_timeout=request_timeout,
                ready_timeout=ready_timeout,
                max_restarts=max_restarts,
                admission=admission,
            ),
        )

    @classmethod
    async def _start(cls, topology: Topology, options: dict[str, Any]) -> "Pipeline":
        collector = None
        run_dir: Path | None = options["run_dir"]
        profiler = None
        profile_address = None
        socket_dir = socketdir.create()  # owner-only; sweeps those of killed servers
        if options["profile"]:
            from omnictl.profiling.collector import Collector
            from omnictl.profiling.rundir import default_run_dir, write_run_info

            run_dir = run_dir or default_run_dir()
            write_run_info(run_dir, topology)
            profile_address = f"ipc://{socket_dir}/profile"
            collector = Collector(run_dir, profile_address).start()
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
        )
        pipeline = cls(coordinator, collector, profiler, run_dir)
        pipeline.admission = options["admission"]
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
    ) -> RequestHandle:
        """Start a request. ``modalities`` selects terminals by modality (None: all).

        ``inputs`` reach the entry stage as given: any data tree, or a chat request (an
        :class:`omnictl.inputs.ChatRequest` or its ``{"messages", "sampling", "voice"}`` dict).
        Its ``sampling`` and ``voice`` are also what every stage sees as the request's params.
        Raises :class:`Overloaded` (or :class:`AdmissionTimeout` after waiting) when admission
        control refuses it; the slot it takes is freed when the request ends, however it ends.
        """
        params = request_params(inputs)
        ticket = await self.admission.admit()
        try:
            handle = await self._coordinator.submit(inputs, modalities, request_id, params=params)
        except BaseException:
            ticket.release()
            raise
        handle.on_done(ticket.release)
        return handle

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

    def process_ids(self) -> dict[str, int]:
        """OS pid of each stage process, by its name (``NAME#i`` for a replica)."""
        return {name: h.process.pid for name, h in self._coordinator.launcher.handles.items()}

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

"""``run_bench``: warm up, drive the load, gather the breakdown, build the result."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from omnictl.bench import breakdown
from omnictl.bench.client import send_request, send_speech, send_transcription
from omnictl.bench.loadgen import closed_loop, open_loop
from omnictl.bench.report import build_result
from omnictl.bench.slo import AudioSlo, judge, where_late
from omnictl.bench.stats import RequestRecord
from omnictl.bench.workload import (
    INPUT_KINDS,
    ROUTES,
    build_payload,
    pick_route,
    speech_payload,
    spoken_samples,
    transcription_form,
    wav_seconds,
)
from omnictl.exceptions import BenchError


@dataclass(frozen=True)
class BenchConfig:
    topology: str | None = None  # launch this (None and no url: the embedded default)
    url: str | None = None  # or measure a running server
    concurrency: int | None = None  # closed loop (default 1 when no rate is given)
    rate: float | None = None  # open loop: Poisson arrivals per second
    num_requests: int = 20
    warmup: int = 2
    input_kind: str = "text"
    modalities: tuple[str, ...] = ("text", "audio")
    max_tokens: int | None = 64
    api_key: str | None = None
    model_path: str | None = None
    device: str | None = None
    run_dir: str | None = None  # the server's run directory, for an exact per-stage breakdown
    audio_file: str | None = None
    request_timeout: float = 300.0
    seed: int = 0
    launcher: str = "local"  # for the pipeline the bench launches
    ray_address: str | None = None
    data_host: str | None = None
    slo_ttfp: float | None = None  # seconds: the audio SLO's time to first packet
    slo_underrun: float | None = None  # seconds: the audio SLO's largest underrun
    route: str | None = None  # chat, speech or transcriptions (None: from what the server serves)

    def check(self) -> None:
        if self.route is not None and self.route not in ROUTES:
            raise BenchError(f"--route must be one of {', '.join(ROUTES)}, got {self.route!r}")
        for name, value in (("--slo-ttfp", self.slo_ttfp), ("--slo-underrun", self.slo_underrun)):
            if value is not None and value < 0:
                raise BenchError(f"{name} must be at least 0 seconds, got {value}")
        if self.concurrency is not None and self.rate is not None:
            raise BenchError("choose one of --concurrency (closed loop) and --rate (open loop), not both")
        if self.concurrency is not None and self.concurrency < 1:
            raise BenchError(f"--concurrency must be at least 1, got {self.concurrency}")
        if self.rate is not None and self.rate <= 0:
            raise BenchError(f"--rate must be positive, got {self.rate}")
        if self.num_requests < 1 or self.warmup < 0:
            raise BenchError("--num-requests must be at least 1 and --warmup at least 0")
        if self.input_kind not in INPUT_KINDS:
            raise BenchError(f"--input must be one of {', '.join(INPUT_KINDS)}, got {self.input_kind!r}")
        unknown = [m for m in self.modalities if m not in ("text", "audio")]
        if unknown or not self.modalities:
            raise BenchError(f"--modalities takes text and/or audio, got {','.join(self.modalities) or 'nothing'}")
        if self.url is not None and self.topology is not None:
            raise BenchError("give a TOPOLOGY to launch or --url of a running server, not both")


class LineProgress:
    """Progress for a console that is not a terminal: a plain line every ``every_s`` seconds.

    It offers the three calls ``_drive`` makes on Rich's Progress.
    """

    def __init__(self, console: Console, every_s: float) -> None:
        self.console = console
        self.every_s = every_s
        self._tasks: dict[int, list[Any]] = {}  # id -> [description, total, completed]
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="omnictl-bench-progress", daemon=True)

    def add_task(self, description: str, total: int) -> int:
        with self._lock:
            task = len(self._tasks)
            self._tasks[task] = [description, total, 0]
        return task

    def advance(self, task: int) -> None:
        with self._lock:
            self._tasks[task][2] += 1

    def remove_task(self, task: int) -> None:
        with self._lock:
            self._tasks.pop(task, None)

    def __enter__(self) -> LineProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopping.wait(self.every_s):
            with self._lock:
                parts = [f"{d} {done}/{total}" for d, total, done in self._tasks.values()]
            elapsed = time.monotonic() - self._started
            self.console.print(
                f"bench: {', '.join(parts) or 'starting'} ({elapsed:.0f} s)", highlight=False, soft_wrap=True
            )


@contextmanager
def _display(
    console: Console, dashboard: Callable[[int], RenderableType] | None, enabled: bool, every_s: float
) -> Iterator[Any]:
    """A progress bar, under the live dashboard when the bench launched the server in a
    terminal; without a terminal, a progress line every few seconds."""
    if not enabled:
        yield None
        return
    if not console.is_terminal:
        with LineProgress(console, every_s) as lines:
            yield lines
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        auto_refresh=False,
    )
    if dashboard is not None and console.is_terminal:

        def view() -> RenderableType:
            return Group(dashboard(console.height - 2), progress)  # the bar takes a row or two
    else:

        def view() -> RenderableType:
            return progress

    with Live(console=console, get_renderable=view, refresh_per_second=4, transient=True):
        yield progress


def _dashboard_of(listening: Any) -> Callable[[int], RenderableType] | None:
    """The same dashboard `serve` shows (live stage figures and rejections included)."""
    pipeline = listening.pipeline
    if pipeline.profile is None or listening.loop is None:
        return None
    from omnictl.profiling.dashboard import Dashboard, pipeline_live_stats

    metrics = listening.state.metrics
    dashboard = Dashboard(
        pipeline.profile.aggregator,
        pipeline.topology,
        live_stats=pipeline_live_stats(pipeline, listening.loop),
        mode="off",
        rejected=lambda: metrics.count("rejected"),
    )
    return dashboard.render


async def _drive(
    config: BenchConfig,
    base_url: str,
    progress: Any,
    model: str,
    route: str = "chat",
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send the warm-up and the measured requests to ``route`` (a key of
    :data:`~omnictl.bench.workload.ROUTES`). ``transport``: httpx's (a test's in-process app)."""
    audio = [Path(config.audio_file).read_bytes()] if config.audio_file else spoken_samples()
    durations = [wav_seconds(wav) for wav in audio] if route == "transcriptions" else []
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    url = base_url.rstrip("/") + ROUTES[route]
    in_flight = config.concurrency or (1 if config.rate is None else 1000)
    limits = httpx.Limits(max_connections=in_flight + 8, max_keepalive_connections=in_flight + 8)
    timeout = httpx.Timeout(config.request_timeout, connect=30.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport) as client:
        origin = time.perf_counter()

        def sender(offset: int) -> Callable[[int], Any]:
            async def send(index: int) -> RequestRecord:
                record = RequestRecord(index=index, sent_at=time.perf_counter() - origin)
                if route == "speech":
                    payload = speech_payload(index + offset, config.max_tokens, model)
                    return await send_speech(client, url, payload, record, headers)
                if route == "transcriptions":
                    form, wav = transcription_form(index + offset, audio, model)
                    seconds = durations[(index + offset) % len(audio)]
                    return await send_transcription(client, url, form, wav, record, headers, seconds)
                payload = build_payload(
                    index + offset, config.input_kind, list(config.modalities), config.max_tokens, audio, model
                )
                return await send_request(client, url, payload, record, headers)

            return send

        def tick(task: Any) -> Callable[[RequestRecord], None]:
            return lambda _record: progress.advance(task) if progress is not None else None

        if config.warmup:
            task = progress.add_task("warm-up", total=config.warmup) if progress else None
            warm = await closed_loop(sender(10_000), config.warmup, config.concurrency or 1, tick(task))
            rejected = [r.error for r in warm if r.error and r.error.startswith("HTTP 4")]
            if len(rejected) == len(warm):
                raise BenchError(f"the server rejects the bench's requests: {rejected[0]}")
            if progress is not None and task is not None:
                progress.remove_task(task)
        task = progress.add_task("requests", total=config.num_requests) if progress else None
        origin = time.perf_counter()
        if config.rate is not None:
            records = await open_loop(sender(0), config.num_requests, config.rate, tick(task), config.seed)
        else:
            records = await closed_loop(sender(0), config.num_requests, config.concurrency or 1, tick(task))
        duration = time.perf_counter() - origin
        return records, duration


def served_model(url: str, api_key: str | None, timeout_s: float = 5.0) -> str:
    """The model id the server at ``url`` serves (what the requests name). Fails at once, in
    one line, when nothing answers there, rather than after a report of zeros."""
    return served(url, api_key, timeout_s)[0]


def served(url: str, api_key: str | None, timeout_s: float = 5.0) -> tuple[str, list[str] | None]:
    """The model id the server at ``url`` serves and the routes it lists for it (omnictl's
    ``/v1/models`` says, under ``endpoints``; None from a server that does not)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        raise BenchError(f"cannot reach {url}: {reason} (is `omnictl serve` running there?)") from exc
    try:
        model = response.raise_for_status().json()["data"][0]
        endpoints = model.get("endpoints")
        return str(model["id"]), [str(e) for e in endpoints] if isinstance(endpoints, list) else None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise BenchError(f"{url}/v1/models did not name a model (HTTP {response.status_code}): {exc}") from exc


def _server_run_dir(base_url: str, api_key: str | None) -> Path | None:
    """The server's trace directory, when it is on this machine (its /health says where,
    to a client that sends the key when the server has one)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        reported = httpx.get(base_url.rstrip("/") + "/health", headers=headers, timeout=10.0).json().get("run_dir")
    except (httpx.HTTPError, ValueError):
        return None
    return Path(reported) if reported and Path(reported).is_dir() else None


def _breakdown(
    config: BenchConfig, base_url: str, run_dir: Path | None, records: list[RequestRecord]
) -> dict[str, Any]:
    ids = [r.request_id for r in records if r.request_id]
    run_dir = run_dir or _server_run_dir(base_url, config.api_key)
    if run_dir is not None and run_dir.is_dir():
        return breakdown.from_trace_store(run_dir, ids)
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    try:
        response = httpx.get(base_url.rstrip("/") + "/metrics", headers=headers, timeout=10.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        return {"source": None, "stages": {}, "edges": {}, "error": f"/metrics unavailable: {exc}"}
    return breakdown.from_metrics(response.text)


def run_bench(
    config: BenchConfig, console: Console | None = None, show_progress: bool = True, progress_every_s: float = 5.0
) -> dict[str, Any]:
    """Run the bench and return its result document (see :func:`omnictl.bench.report.build_result`).

    ``progress_every_s``: how often a progress line is printed when ``console`` is not a terminal."""
    from omnictl.serving.background import BackgroundServer
    from omnictl.serving.common.capabilities import capabilities
    from omnictl.serving.config import HttpConfig, ServeConfig

    config.check()
    console = console or Console(stderr=True)
    with ExitStack() as stack:
        run_dir = Path(config.run_dir) if config.run_dir else None
        dashboard = None
        if config.url is not None:
            model, endpoints = served(config.url, config.api_key)
            base_url, target = config.url, config.url
        else:
            serving = ServeConfig(topology=config.topology, http=HttpConfig(port=0, api_key=config.api_key)).launching(
                model_path=config.model_path,
                device=config.device,
                run_dir=config.run_dir,
                request_timeout=config.request_timeout,
                launcher=config.launcher,
                ray_address=config.ray_address,
                data_host=config.data_host,
            )
            with console.status("launching the pipeline..."):
                listening = stack.enter_context(BackgroundServer(serving))
            base_url, target = listening.url, config.topology or "embedded voice assistant"
            model, endpoints = listening.state.model_name, capabilities(listening.pipeline.topology).endpoints()
            run_dir = run_dir or _pipeline_run_dir(listening.pipeline)
            dashboard = _dashboard_of(listening)
            if run_dir is not None:
                console.print(f"traces in {run_dir}", soft_wrap=True, highlight=False)
        route = resolve_route(config.route, endpoints)
        with _display(console, dashboard, show_progress, progress_every_s) as progress:
            records, duration = asyncio.run(_drive(config, base_url, progress, model, route))
        found = _breakdown(config, base_url, run_dir, records)
        slo = _slo(config, base_url, run_dir, records, duration)
    settings = {k: v for k, v in asdict(config).items() if k != "api_key"}
    return build_result({**settings, "target": target, "route": route}, records, duration, found, slo)


def resolve_route(asked: str | None, endpoints: list[str] | None) -> str:
    """The route to drive: ``asked`` (--route) when the server serves it, else the one
    :func:`~omnictl.bench.workload.pick_route` picks from what it serves; a route it does
    not serve fails at once, naming what it does."""
    if asked is None:
        try:
            return pick_route(endpoints)
        except ValueError as exc:
            raise BenchError(str(exc)) from exc
    if endpoints is not None and ROUTES[asked] not in endpoints:
        raise BenchError(
            f"--route {asked}: the server does not serve {ROUTES[asked]}; it serves {', '.join(endpoints) or 'nothing'}"
        )
    return asked


def _slo(
    config: BenchConfig, base_url: str, run_dir: Path | None, records: list[RequestRecord], duration: float
) -> dict[str, Any] | None:
    """Goodput under the audio SLO, and where each missed request's late chunk waited
    (from the server's trace store, when it is on this machine)."""
    slo = AudioSlo(config.slo_ttfp, config.slo_underrun)
    if not slo.set:
        return None
    summary, misses = judge(records, slo, duration)
    run_dir = run_dir or _server_run_dir(base_url, config.api_key)
    if run_dir is not None and run_dir.is_dir():
        summary["missed"] = where_late(run_dir, misses)
    else:
        summary["missed"] = [{"request_id": m.request_id, "reason": m.reason, "stage": None} for m in misses]
    return summary


def _pipeline_run_dir(pipeline: Any) -> Path | None:
    """Where the launched pipeline's profiler writes its trace store."""
    run_dir = pipeline.run_dir
    return Path(run_dir) if run_dir is not None else None

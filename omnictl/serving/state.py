"""What every route shares: the pipeline (once it is ready), limits, key, metrics, the active table."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Protocol

from omnictl.profiler import NullProfiler, Profiler
from omnictl.serving.chat.protocol import Limits
from omnictl.serving.common.metrics import ServerMetrics

if TYPE_CHECKING:
    from omnictl.serving.common.tracking import Tracked


class PipelineLike(Protocol):
    """What the server needs from :class:`omnictl.Pipeline`."""

    @property
    def topology(self) -> Any: ...

    @property
    def healthy(self) -> bool: ...

    run_dir: Any

    async def submit(
        self,
        inputs: Any,
        modalities: list[str] | None = None,
        request_id: str | None = None,
        traceparent: str | None = None,
        stream: bool = True,
        input_stream: bool = False,
    ) -> Any: ...

    async def abort(self, request_id: str) -> Any: ...

    async def stats(self, timeout: float = 5.0) -> dict[str, dict[str, Any]]: ...

    def in_flight(self) -> int: ...

    def health(self) -> tuple[str, dict[str, str]]: ...

    def nodes(self) -> dict[str, dict[str, Any]]: ...

    def process_ids(self) -> dict[str, int]: ...

    admission: Any  # omnictl.admission.Admission: --max-in-flight and --max-queue-wait


@dataclass
class ServingState:
    """Shared between the launcher (which sets ``pipeline`` once ready) and the routes."""

    model_name: str  # the topology's `name`: the model id clients ask for
    aliases: tuple[str, ...] = ()  # other model ids accepted (`--served-model-name`)
    pipeline: PipelineLike | None = None
    # The streaming speech recognition realtime sessions transcribe a turn with while it is
    # spoken (a pipeline whose entry takes a streamed input: the asr-stream topology); None:
    # each committed turn is transcribed whole by `pipeline`'s transcript terminal.
    live_transcriber: PipelineLike | None = None
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    active: dict[str, Tracked] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))
    tracing: bool = False  # the pipeline exports traces: requests' `traceparent` headers are read
    # OS processes that did not answer the last liveness check (the server's monitor and
    # /health): admission refuses new requests at once (503) instead of sending them to hang.
    unresponsive: list[str] = field(default_factory=list)
    # Records the server's own events (an audio stream's underruns) into the traces; set
    # with the pipeline when it profiles.
    profiler: Profiler = field(default_factory=NullProfiler)
    # Admission by continuity (``serve --max-underrun-ms``); None: off.
    max_underrun_ms: float | None = None
    # Run when the server stops, before open requests are ended: what holds connections
    # uvicorn does not know of (WebRTC calls) closes them.
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def traceparent(self, headers: Mapping[str, str]) -> str | None:
        """The caller's W3C ``traceparent`` header, read only while traces are exported."""
        return headers.get("traceparent") if self.tracing else None

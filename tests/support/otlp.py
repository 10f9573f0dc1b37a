"""A real OTLP/HTTP receiver for the tests: POST /v1/traces on 127.0.0.1, decoded with opentelemetry-proto.

What it received is kept as :class:`ReceivedSpan` records (ids as hex, times in ns,
attributes and events as plain dicts), so a test can check the links between spans.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    start_ns: int
    end_ns: int
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    status_code: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any] = field(default_factory=dict)


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class OtlpReceiver:
    """``with OtlpReceiver() as receiver:`` ``receiver.url`` is the base URL to export to."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.posts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver._take(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return None  # quiet

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    def _take(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(ReceivedSpan(
                        span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                        span.start_time_unix_nano, span.end_time_unix_nano, span.kind, _attributes(span.attributes),
                        [(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in span.events],
                        span.status.code, resource,
                    ))
        with self._lock:
            self.spans.extend(spans)
            self.posts += 1

    def of_request(self, request_id: str) -> list[ReceivedSpan]:
        """The span whose ``omnictl.request_id`` is ``request_id`` and every span under it
        (other requests of the same caller share its trace id, not its root)."""
        with self._lock:
            spans = list(self.spans)
        tree = [s for s in spans if s.attributes.get("omnictl.request_id") == request_id]
        ids = {s.span_id for s in tree}
        while True:
            children = [s for s in spans if s.parent_span_id in ids and s.span_id not in ids]
            if not children:
                return tree
            tree += children
            ids.update(s.span_id for s in children)

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := predicate()):
            if time.monotonic() > deadline:
                raise AssertionError(f"the OTLP receiver did not get what was expected within {timeout} s "
                                     f"({len(self.spans)} spans in {self.posts} posts)")
            time.sleep(0.05)
        return value

    def __enter__(self) -> "OtlpReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __iter__(self) -> Iterator[ReceivedSpan]:
        with self._lock:
            return iter(list(self.spans))

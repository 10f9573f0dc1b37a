"""OpenTelemetry export of finished requests (``serve --otlp-endpoint``), off by default.

endpoint     resolve_endpoint: the flag or OTEL_EXPORTER_OTLP_ENDPOINT → the OTLP/HTTP traces URL;
             OtlpTarget: what the profiling collector is told (URL, model, terminals' modalities)
traceparent  parse_traceparent: a W3C ``traceparent`` header → the caller's span (server side)
pending      PendingTraces: a finished request's profiling events, held until they are complete
spans        emit_trace: one request's events → OpenTelemetry spans with their recorded times
export       OtlpSink: the collector's hook; builds spans on a thread, the SDK exports them

Traces are built from the profiler's events (the timing system there is), in the profiling
collector's process, once a request has ended: stage processes never talk OTLP. Only
``endpoint`` and ``pending`` are free of opentelemetry imports; the others are imported only
when an endpoint is set, so a server without one never loads opentelemetry at all.
"""

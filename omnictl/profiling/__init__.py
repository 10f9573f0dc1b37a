"""Per-request profiling: every request recorded stage by stage.

events      the vocabulary (EventKind, Event) and the Profiler protocol
recorder    Recorder: per-process bounded buffer, shipped in batches over ZeroMQ
collector   Collector: receives batches (in a process of its own), stores and aggregates
store       TraceStore (JSONL segments with rotation) and run directories
aggregate   Aggregator: live per-stage / per-edge figures (ProfileSnapshot)
spans       build_trace: one request's spans (queue, fan-in, build, prefill, decode, hops)
dashboard   render_dashboard, Dashboard (Rich Live), status_line
trace_render, chrome   the `omnictl trace` waterfall, JSON and Chrome/Perfetto export

Modules are imported one by one (nothing is re-exported here) so that importing the
event vocabulary stays cheap in every stage process.
"""

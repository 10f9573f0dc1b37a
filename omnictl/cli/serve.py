"""`omnictl serve [TOPOLOGY]`: launch the pipeline and serve the OpenAI-compatible API."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from omnictl.cli import placement
from omnictl.playback.policy import DEFAULT_POLICY


def serve_command(
    topology: Annotated[
        Path | None,
        typer.Argument(metavar="TOPOLOGY", help="Topology YAML; default: the embedded CPU voice assistant."),
    ] = None,
    host: Annotated[
        str, typer.Option(metavar="HOST", help="Address to bind; 0.0.0.0 exposes the server to the network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(metavar="PORT", help="Port to listen on (0: any free port).")] = 8000,
    model_path: Annotated[
        str | None,
        typer.Option("--model-path", metavar="DIR", help="Checkpoint directory passed to the stage factories."),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", envvar="OMNICTL_API_KEY", metavar="KEY", help="Require 'Authorization: Bearer KEY'."),
    ] = None,
    device: Annotated[
        str | None, typer.Option(metavar="DEVICE", help="'cpu' drops the topology's GPU placement.")
    ] = None,
    no_dashboard: Annotated[
        bool, typer.Option("--no-dashboard", help="Print status lines instead of the live dashboard.")
    ] = False,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", metavar="DIR", help="Where the profiler writes this run's traces.")
    ] = None,
    max_body_mb: Annotated[
        float, typer.Option("--max-body-mb", metavar="MB", help="Largest request body accepted (413 above).")
    ] = 32.0,
    max_audio_mb: Annotated[
        float, typer.Option("--max-audio-mb", metavar="MB", help="Largest decoded input audio part (413 above).")
    ] = 16.0,
    body_timeout: Annotated[
        float,
        typer.Option(
            "--body-timeout", metavar="SECONDS", help="Seconds a client may take to send its request body (408 after)."
        ),
    ] = 30.0,
    request_timeout: Annotated[
        float, typer.Option("--request-timeout", metavar="SECONDS", help="Seconds before a request fails.")
    ] = 300.0,
    served_model_name: Annotated[
        list[str] | None,
        typer.Option(
            "--served-model-name",
            metavar="NAME",
            help="Also accept requests naming this model (repeatable); the topology's `name` is always served.",
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option("--log-level", metavar="LEVEL", help="debug, info, warning or error.")
    ] = "info",
    log_format: Annotated[
        str, typer.Option("--log-format", metavar="FORMAT", help="Log lines as 'text' or 'json' (one object a line).")
    ] = "text",
    max_in_flight: Annotated[
        int,
        typer.Option(
            "--max-in-flight",
            min=0,
            metavar="N",
            help="Admission control: requests in flight at once; over it a request gets 429 with Retry-After (0: no limit).",
        ),
    ] = 64,
    max_queue_wait: Annotated[
        float,
        typer.Option(
            "--max-queue-wait",
            min=0.0,
            metavar="SECONDS",
            help="Let a request over the limit wait this long for a slot (503 after); 0: refuse at once.",
        ),
    ] = 0.0,
    audio_policy: Annotated[
        str,
        typer.Option(
            "--audio-policy",
            metavar="POLICY",
            help="How audio stages pick the next stream: fifo, or deadline (least playback slack first).",
        ),
    ] = DEFAULT_POLICY,
    max_underrun_ms: Annotated[
        float | None,
        typer.Option(
            "--max-underrun-ms",
            min=0.0,
            metavar="MS",
            help="Refuse a new audio request (429) when admitting it would make a playing stream underrun by more.",
        ),
    ] = None,
    live_transcriber: Annotated[
        Path | None,
        typer.Option(
            "--live-transcriber",
            metavar="TOPOLOGY",
            help="Deprecated: the voice assistant transcribes realtime turns while they are spoken itself, on its "
            "own Whisper (every session, by default), and this is then ignored. For a topology that does not, a "
            "streaming recogniser's topology (e.g. asr_stream) launched beside it.",
        ),
    ] = None,
    max_restarts: Annotated[
        int,
        typer.Option(
            "--max-restarts",
            min=0,
            metavar="N",
            help="Restart a stage process (each replica on its own) up to N times after it dies; 0: it stays down.",
        ),
    ] = 0,
    replay_limit: Annotated[
        int,
        typer.Option(
            "--replay-limit",
            min=0,
            metavar="N",
            help="Re-run a request from the entry up to N times when a process it was pinned to dies before "
            "its caller saw any output; 0: it fails with the process.",
        ),
    ] = 1,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            "--otlp-endpoint",
            metavar="URL",
            help="Export every finished request as an OpenTelemetry trace to this OTLP/HTTP collector "
            "(e.g. http://127.0.0.1:4318; default: $OTEL_EXPORTER_OTLP_ENDPOINT, else off).",
        ),
    ] = None,
    max_realtime_sessions: Annotated[
        int,
        typer.Option(
            "--max-realtime-sessions",
            min=1,
            metavar="N",
            help="/v1/realtime sessions at once; one more is refused with an error event and close code 1013.",
        ),
    ] = 16,
    max_connecting_calls: Annotated[
        int,
        typer.Option(
            "--max-connecting-calls",
            min=1,
            metavar="N",
            help="WebRTC calls (POST /v1/realtime/calls) answered but not yet connected at once; one more is "
            "refused with 429. Offers that never connect hold at most N realtime sessions.",
        ),
    ] = 4,
    call_connect_timeout: Annotated[
        float,
        typer.Option(
            "--call-connect-timeout",
            min=0.1,
            metavar="SECONDS",
            help="Seconds from a WebRTC offer's arrival until its call must be connected; then it is closed.",
        ),
    ] = 10.0,
    max_connections: Annotated[
        int | None,
        typer.Option(
            "--max-connections",
            min=1,
            metavar="N",
            help="Open HTTP/WebSocket connections at once (default: what the open-files limit allows, less a reserve).",
        ),
    ] = None,
    header_timeout: Annotated[
        float,
        typer.Option(
            "--header-timeout",
            min=0.1,
            metavar="SECONDS",
            help="Seconds a connection may take to send its request headers before it is closed.",
        ),
    ] = 10.0,
    allowed_origins: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-origins",
            metavar="ORIGIN",
            help="A web origin (http://host:port) allowed besides the server's own (repeatable; '*': any).",
        ),
    ] = None,
    allowed_hosts: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-hosts",
            metavar="NAME",
            help="A Host name accepted besides IP addresses and localhost (repeatable; '*': any).",
        ),
    ] = None,
    launcher: placement.Launcher = "local",
    ray_address: placement.RayAddress = None,
    data_host: placement.DataHost = None,
) -> None:
    """Serve a topology over an OpenAI-compatible HTTP API (chat completions with text and audio)."""
    from rich.console import Console

    from omnictl.cli import invocation
    from omnictl.exceptions import OmnictlError
    from omnictl.launch_config import AdmissionConfig, FaultConfig, LaunchConfig, PlacementConfig, ProfilingConfig
    from omnictl.logs import FORMATS, configure
    from omnictl.serving import HttpConfig, Listening, ServeConfig, serve
    from omnictl.serving.chat.protocol import Limits
    from omnictl.serving.common.capabilities import capabilities
    from omnictl.serving.ready import ready_message
    from omnictl.serving.server import is_loopback

    console = Console()
    errors = Console(stderr=True)
    if log_format not in FORMATS or log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        errors.print(
            f"error: --log-format must be text or json and --log-level debug, info, warning or error "
            f"(got {log_format!r}, {log_level!r})"
        )
        raise typer.Exit(2)
    configure(log_level, log_format)  # type: ignore[arg-type]  # checked just above
    from omnictl.telemetry.endpoint import resolve_endpoint

    try:
        traces_to = resolve_endpoint(otlp_endpoint, os.environ)  # the flag wins over the variable
    except OmnictlError as exc:
        errors.print(f"error: {exc}")
        raise typer.Exit(2) from exc
    if api_key is not None and api_key != os.environ.get("OMNICTL_API_KEY"):
        errors.print(
            "warning: --api-key on the command line is visible to every user of this machine (ps, "
            "/proc/PID/cmdline); prefer the OMNICTL_API_KEY environment variable"
        )
    if api_key is None and "OMNICTL_API_KEY" in os.environ:
        api_key = os.environ["OMNICTL_API_KEY"]  # Click drops an empty variable: it is refused below, not ignored
    try:  # each part checks its values as it is made (--audio-policy's among them)
        config = ServeConfig(
            topology=topology,
            http=HttpConfig(
                host=host,
                port=port,
                api_key=api_key,
                served_model_names=tuple(served_model_name or ()),
                allowed_origins=tuple(allowed_origins or ()),
                allowed_hosts=tuple(allowed_hosts or ()),
            ),
            launch=LaunchConfig(
                model_path=model_path,
                device=device,
                request_timeout=request_timeout,
                audio_policy=audio_policy,
                faults=FaultConfig(max_restarts=max_restarts, replay_limit=replay_limit),
                admission=AdmissionConfig(max_in_flight=max_in_flight or None, max_queue_wait=max_queue_wait),
                profiling=ProfilingConfig(run_dir=run_dir, otlp_endpoint=traces_to),  # a server profiles: the dashboard
                placement=PlacementConfig(launcher=launcher, ray_address=ray_address, data_host=data_host),
            ),
            limits=Limits(
                int(max_body_mb * 1024 * 1024),
                int(max_audio_mb * 1024 * 1024),
                body_timeout_s=body_timeout,
                header_timeout_s=header_timeout,
                max_connections=max_connections,
                max_realtime_sessions=max_realtime_sessions,
                max_realtime_connecting=max_connecting_calls,
                realtime_connect_timeout_s=call_connect_timeout,
            ),
            max_underrun_ms=max_underrun_ms,
            live_transcriber=live_transcriber,
        )
    except ValueError as exc:
        errors.print(f"error: {exc}")
        raise typer.Exit(2) from exc
    dashboards: list[object] = []

    def on_ready(listening: Listening) -> None:
        pipe = listening.pipeline
        topo = pipe.topology
        console.print(
            ready_message(
                listening.url,
                listening.state.model_name,
                topo.terminals,
                len(topo.stages),
                len(topo.instances()),
                api_key,
                str(pipe.run_dir) if pipe.run_dir is not None else None,
                program=invocation.program(),
                serves=capabilities(topo),
            ),
            soft_wrap=True,
        )
        if pipe.otlp_endpoint is not None:
            console.print(f"OpenTelemetry: every finished request's trace goes to {pipe.otlp_endpoint}", soft_wrap=True)
        if pipe.profile is not None:
            import asyncio

            from omnictl.profiling.dashboard import Dashboard, DashboardMode, pipeline_live_stats

            mode: DashboardMode = "lines" if no_dashboard else "auto"
            metrics = listening.state.metrics
            dashboard = Dashboard(
                pipe.profile.aggregator,
                topo,
                live_stats=pipeline_live_stats(pipe, asyncio.get_running_loop()),
                console=console,
                mode=mode,
                rejected=lambda: metrics.count("rejected"),
                where=(listening.url, f"traces {pipe.run_dir}") if pipe.run_dir is not None else (listening.url,),
            )
            dashboards.append(dashboard.start())

    if not is_loopback(host) and api_key is None:
        errors.print(
            f"[bold red]WARNING:[/] serving on {host} without --api-key: anyone who can reach "
            "this address can use the server and every model it runs"
        )
    console.print(f"omnictl serve: launching {topology or 'the embedded voice assistant'} (loading models)...")
    try:
        serve(config, on_ready)
    except OmnictlError as exc:  # every deliberate error: bad topology, stage failed to start, port busy
        from omnictl.cli.failures import report_failure

        report_failure(errors, exc, "serve")
        raise typer.Exit(1) from exc
    finally:
        for dashboard in dashboards:
            dashboard.stop()  # type: ignore[attr-defined]  # the dashboard object is only known to have stop() at run time (live or plain)
    console.print("omnictl serve: stopped")


def register(app: typer.Typer) -> None:
    from omnictl.cli.help import command

    command(app, "serve")(serve_command)

"""`omnictl bench [TOPOLOGY | --url URL]`: load-test a pipeline and print its figures."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from omnictl.cli import placement


def bench_command(
    topology: Annotated[
        str | None,
        typer.Argument(metavar="TOPOLOGY", help="Topology to launch; default: the embedded voice assistant."),
    ] = None,
    url: Annotated[
        str | None, typer.Option(metavar="URL", help="Measure a running server instead (e.g. http://127.0.0.1:8000).")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(metavar="N", help="Closed loop: requests kept in flight (default 1).")
    ] = None,
    rate: Annotated[float | None, typer.Option(metavar="PER_S", help="Open loop: Poisson arrivals per second.")] = None,
    num_requests: Annotated[int, typer.Option("--num-requests", "-n", metavar="N", help="Measured requests.")] = 20,
    warmup: Annotated[int, typer.Option(metavar="N", help="Requests sent first and not measured.")] = 2,
    input_kind: Annotated[
        str, typer.Option("--input", metavar="KIND", help="text, audio (a spoken question) or mixed.")
    ] = "text",
    modalities: Annotated[
        str, typer.Option(metavar="LIST", help="Outputs to ask for: text, audio or text,audio.")
    ] = "text,audio",
    max_tokens: Annotated[int, typer.Option("--max-tokens", metavar="N", help="Answer length cap per request.")] = 64,
    route: Annotated[
        str | None,
        typer.Option(
            metavar="ROUTE",
            help="chat, speech (/v1/audio/speech) or transcriptions (/v1/audio/transcriptions); "
            "default: what the server serves (a speech synthesizer: speech; a recognizer alone: transcriptions).",
        ),
    ] = None,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json", metavar="FILE", help="Write every figure and each request's raw figures here (times in seconds)."
        ),
    ] = None,
    compare: Annotated[
        Path | None, typer.Option(metavar="FILE", help="An earlier --json result to print the differences against.")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="OMNICTL_API_KEY",
            metavar="KEY",
            help="Sent as 'Authorization: Bearer KEY'; also the key of a server the bench launches.",
        ),
    ] = None,
    model_path: Annotated[
        str | None,
        typer.Option("--model-path", metavar="DIR", help="Checkpoint directory for the topology the bench launches."),
    ] = None,
    device: Annotated[
        str | None, typer.Option(metavar="DEVICE", help="'cpu' drops the topology's GPU placement.")
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option("--run-dir", metavar="DIR", help="The server's run directory, for an exact per-stage breakdown."),
    ] = None,
    audio_file: Annotated[
        Path | None, typer.Option("--audio-file", metavar="WAV", help="WAV to send for --input audio.")
    ] = None,
    request_timeout: Annotated[
        float, typer.Option("--request-timeout", metavar="SECONDS", help="Seconds before a request counts as failed.")
    ] = 300.0,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar or dashboard.")] = False,
    slo_ttfp: Annotated[
        float | None,
        typer.Option(
            "--slo-ttfp",
            metavar="SECONDS",
            help="Audio SLO: first audio within this (goodput counts requests meeting both).",
        ),
    ] = None,
    slo_underrun: Annotated[
        float | None,
        typer.Option(
            "--slo-underrun", metavar="SECONDS", help="Audio SLO: largest underrun (the listener's wait) within this."
        ),
    ] = None,
    launcher: placement.Launcher = "local",
    ray_address: placement.RayAddress = None,
    data_host: placement.DataHost = None,
) -> None:
    """Measure TTFT, time to first audio, real-time factor (RTF, lower is better), latency percentiles and throughput under load."""
    import json

    from rich.console import Console

    from omnictl.bench.report import load_result, print_result
    from omnictl.bench.runner import BenchConfig, run_bench
    from omnictl.exceptions import OmnictlError

    console = Console()
    errors = Console(stderr=True)
    previous = None
    try:
        if compare is not None:
            previous = load_result(compare)  # fail before the run, not after it
        config = BenchConfig(
            topology=topology,
            url=url,
            concurrency=concurrency,
            rate=rate,
            num_requests=num_requests,
            warmup=warmup,
            input_kind=input_kind,
            route=route,
            modalities=tuple(m.strip() for m in modalities.split(",") if m.strip()),
            max_tokens=max_tokens,
            api_key=api_key,
            model_path=model_path,
            device=device,
            run_dir=str(run_dir) if run_dir else None,
            audio_file=str(audio_file) if audio_file else None,
            request_timeout=request_timeout,
            launcher=launcher,
            ray_address=ray_address,
            data_host=data_host,
            slo_ttfp=slo_ttfp,
            slo_underrun=slo_underrun,
        )
        result = run_bench(config, console=errors, show_progress=not no_progress)
    except (OmnictlError, ValueError) as exc:  # BenchError, bad topology, launch failure, unreadable --compare
        from omnictl.cli.failures import report_failure

        report_failure(errors, exc, "bench")
        raise typer.Exit(2) from exc
    print_result(result, console, previous)
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=1))
        console.print(f"results written to {json_out}")
    if result["summary"]["completed"] == 0:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    from omnictl.cli.help import command

    command(app, "bench")(bench_command)

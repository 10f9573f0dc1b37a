"""Audio that keeps coming under load: ``fifo`` against ``deadline`` (and admission on), side by side.

Open-loop Poisson arrivals at increasing rates, the same seeded schedule for every
configuration, against a real ``omnictl serve`` (in this process, on a free port) per
configuration, all up at once, each rate run on each in turn (so a shared machine's
changing load falls on every configuration alike):

- ``fifo``: ``--audio-policy fifo`` (the audio stages serve the oldest work first);
- ``deadline``: ``--audio-policy deadline`` (the stream whose listener runs out soonest);
- ``deadline+admit``: ``deadline`` with ``--max-underrun-ms`` (a new audio request gets
  429 when it is predicted to make a playing stream underrun).

Each request is a streamed chat completion asking for text and pcm16 audio, sampled with
its own index as its seed (every configuration hears the same answers, of the same lengths,
and a run repeats: a random-weight talker says end-of-speech at its first code for ~2% of
unseeded requests, which then play no audio), timed by the bench's own receive clock
(:mod:`omnictl.bench.client`); the playback clock (:mod:`omnictl.playback.continuity`)
makes its figures. Per rate: TTFP p50/p90, largest underrun p50/p95, continuity at 100 ms
(streams whose largest underrun stayed within it), goodput under the SLO (``--slo-ttfp``,
``--slo-underrun``), refused requests, and why a request did not play (failed, or answered
without audio). The server's own figure per stream (the underruns it recorded into the
trace) is compared with the client's.

Topologies (``--topology``): ``voice`` (the embedded voice assistant: SmolLM2, Piper, asked
for answers of ``--sentences`` sentences, so that the sentence TTS serves several streams
that each have audio in hand: with one-sentence answers a gap only comes from the LLM still
writing, which no choice at the TTS can shorten) and
``qwen`` (``topologies/qwen3-omni.yaml`` on a random-weight checkpoint of ``--size``, ``mid`` by
default, written to a temporary directory, or the one ``--model-path`` names: its code2wav
stage schedules by the policy). ``--device cuda`` keeps the topology's GPU placement (both
GPU processes on GPU 0 when the machine has one); ``cpu`` drops it.

Goals (the issue's, printed met / not met): on each topology ``deadline`` sustains (p95
largest underrun <= 100 ms) >= 1.5x the rate ``fifo`` sustains, with TTFP p90 no worse at
that rate; with admission on, p95 largest underrun <= 100 ms for admitted streams at 2x
the sustainable rate, refusals answered in < 50 ms; the server's underrun figures within
50 ms of the client's, per stream.

For each configuration the requests that missed the SLO are placed, from the profiler's
trace, at the stage (and part) where their late chunk spent the most time: where the gaps
come from.

With ``--configs fifo,deadline`` only the first two goals are judged. ``--json PATH`` writes
each configuration's figures per rate, the sustained rates and the goals there, rewritten
after every rate (a run stopped at its time limit keeps what it measured); ``--run-dir DIR``
keeps each server's run directory (its profile and its stage processes' logs) under DIR.

Run: ``python benchmarks/audio_continuity.py`` (the voice assistant, three rates, 16
requests each; ``--topology voice,qwen`` for both; ``--configs fifo`` for a pilot; on a GPU,
``benchmarks/gpu_session.sh``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from omnictl.bench.breakdown import gather  # noqa: E402
from omnictl.bench.client import send_request  # noqa: E402
from omnictl.bench.loadgen import open_loop  # noqa: E402
from omnictl.bench.slo import AudioSlo, judge, where_late  # noqa: E402
from omnictl.bench.stats import RequestRecord  # noqa: E402
from omnictl.bench.workload import build_payload  # noqa: E402
from omnictl.profiling.events import EventKind  # noqa: E402
from omnictl.profiling.store import TraceStore  # noqa: E402

CONFIGS = {"fifo": False, "deadline": False, "deadline+admit": True}  # name -> admission on
TOPICS = ("the moon", "bees", "volcanoes", "the ocean", "trains", "coffee", "rainbows", "penguins",
          "the desert", "bicycles", "clouds", "chess")
SUSTAIN_S = 0.100  # p95 largest underrun a rate must keep to count as sustained
AGREE_S = 0.050
REFUSE_S = 0.050


@dataclass
class RateFigures:
    rate: float
    records: list[RequestRecord]
    refusal_s: list[float] = field(default_factory=list)
    server_largest: dict[str, float] = field(default_factory=dict)  # request id -> the server's figure
    late_at: dict[str, int] = field(default_factory=dict)  # "stage part" -> SLO misses whose late chunk was held there

    def played(self) -> list[RequestRecord]:
        return [r for r in self.records if r.ok and r.audio_chunks]

    def pct(self, values: list[float], q: float) -> float | None:
        return float(np.percentile(values, q)) if values else None

    def ttfp(self, q: float) -> float | None:
        return self.pct([r.ttfa for r in self.played() if r.ttfa is not None], q)

    def underrun(self, q: float) -> float | None:
        return self.pct([r.continuity().largest_underrun_s for r in self.played()], q)

    def continuity(self, ms: int = 100) -> float | None:
        played = self.played()
        if not played:
            return None
        return sum(r.continuity().largest_underrun_s * 1000 <= ms for r in played) / len(played)

    def disagreement(self) -> float | None:
        gaps = [abs(self.server_largest.get(r.request_id or "", 0.0) - r.continuity().largest_underrun_s)
                for r in self.played()]
        return max(gaps) if gaps else None

    def sustained(self) -> bool:
        p95 = self.underrun(95)
        return p95 is not None and p95 <= SUSTAIN_S

    def summary(self) -> dict[str, Any]:
        """The figures the report prints, for ``--json`` (seconds; None where nothing played)."""
        return {
            "requests": len(self.records),
            "played": len(self.played()),
            "refused": sum(r.overloaded for r in self.records),
            # why the others did not play: failed (the error, per request) or answered without audio
            "failed": {str(r.request_id or r.index): r.error for r in self.records if not r.ok and not r.overloaded},
            "without_audio": sum(r.ok and not r.audio_chunks for r in self.records),
            "ttfp_p50_s": self.ttfp(50),
            "ttfp_p90_s": self.ttfp(90),
            "underrun_p50_s": self.underrun(50),
            "underrun_p95_s": self.underrun(95),
            "continuity_100ms": self.continuity(),
            "server_vs_client_s": self.disagreement(),
            "sustained": self.sustained(),
        }


def qwen_topology(scratch: Path, max_codes: int, size: str = "mid", model_path: str | None = None,
                  device: str = "cpu") -> tuple[str, str]:
    """(topology file, checkpoint): the random-weight Qwen3-Omni of ``size`` (written here,
    its weights initialised on ``device``) or the checkpoint at ``model_path``. On a machine
    with one GPU the talker's process moves to GPU 0 beside the thinker."""
    if model_path is None:
        from omnictl.models.qwen3_omni.tiny import write_tiny_checkpoint

        init = device if device.startswith("cuda") else "cpu"
        model_path = str(write_tiny_checkpoint(scratch / f"{size}-qwen3-omni", size=size, device=init))
    text = (REPO / "topologies" / "qwen3-omni.yaml").read_text()
    if device.startswith("cuda") and _gpu_count() < 2:
        text = text.replace("gpu: 1\n", "gpu: 0\n")
    factory = "factory: omnictl.models.qwen3_omni.stages.talker_ar\n"
    if factory not in text:
        raise SystemExit(f"topologies/qwen3-omni.yaml no longer has {factory.strip()!r} to give max_codes to")
    text = text.replace(factory, factory + f"    factory_args: {{max_codes: {max_codes}}}\n")
    path = scratch / "qwen3-omni.yaml"
    path.write_text(text)
    return str(path), model_path


def serve_device(device: str, model_path: str | None) -> str | None:
    """The server's ``device`` for ``--device``: the voice assistant (no ``model_path``) is
    CPU-only as shipped; Qwen3-Omni on ``cpu`` drops the topology's GPU placement, and on
    ``cuda`` keeps it (None: a topology file's loader takes None or "cpu" only, and refused
    "cuda" before any stage started)."""
    if model_path is None or device.startswith("cuda"):
        return None
    return "cpu"


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def voice_topology(scratch: Path, sentences: int, max_tokens: int) -> str:
    """The embedded voice assistant, asked for ``sentences``-sentence answers."""
    from omnictl.serving.server import default_topology

    text = default_topology().read_text()
    for old, new in (
        ('"You are a voice assistant. Answer in one short, direct sentence."',
         f'"You are a voice assistant. Answer in {sentences} short sentences."'),
        ("max_sentences: 1\n", f"max_sentences: {sentences}\n"),
        ("max_tokens: 32\n", f"max_tokens: {max_tokens}\n"),
    ):
        if old not in text:
            raise SystemExit(f"the embedded voice assistant no longer has {old.strip()!r} to change")
        text = text.replace(old, new)
    path = scratch / "voice-assistant.yaml"
    path.write_text(text)
    return str(path)


def payload(index: int, model: str, sentences: int, max_tokens: int) -> dict[str, Any]:
    """Request ``index``: text and pcm16 audio, a question asking for several sentences,
    sampled with seed ``index`` (the same answer under every configuration)."""
    question = f"Tell me about {TOPICS[index % len(TOPICS)]} in {sentences} sentences."
    body = build_payload(index, "text", ["text", "audio"], max_tokens, [], model)
    body["messages"] = [{"role": "user", "content": question}]
    body["seed"] = index
    return body


def server_underruns(run_dir: Path, ids: set[str], wait_s: float = 3.0) -> dict[str, float]:
    """The server's largest underrun per request, from the UNDERRUN events it recorded: read
    once every request has ended in the trace and the recorders' batches (shipped every 50 ms)
    have settled, within ``wait_s`` (a fixed wait of ``wait_s`` before: 3 s a config and rate)."""
    largest: dict[str, float] = defaultdict(float)
    for request_id, events in gather(TraceStore(run_dir), ids, wait_s).items():
        for event in events:
            seconds = event.meta.get("seconds")
            if event.kind is EventKind.UNDERRUN and isinstance(seconds, (int, float)):
                largest[request_id] = max(largest[request_id], float(seconds))
    return dict(largest)


async def drive(url: str, model: str, rate: float, count: int, seed: int, args: Any,
                offset: int) -> tuple[list[RequestRecord], list[float]]:
    refusals: list[float] = []
    limits = httpx.Limits(max_connections=count + 8, max_keepalive_connections=count + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0), limits=limits) as client:
        origin = time.perf_counter()

        async def send(index: int) -> RequestRecord:
            body = payload(index + offset, model, args.sentences, args.max_tokens)
            record = RequestRecord(index=index, sent_at=time.perf_counter() - origin)
            began = time.perf_counter()
            await send_request(client, url + "/v1/chat/completions", body, record, {})
            if record.overloaded:
                refusals.append(time.perf_counter() - began)
            return record

        records = await open_loop(send, count, rate, lambda record: None, seed)
    return records, refusals


def drive_apart(url: str, model: str, rate: float, count: int, seed: int, args: Any,
                offset: int) -> tuple[list[RequestRecord], list[float]]:
    """:func:`drive`, in the client's own process (see :data:`CLIENT`)."""
    return asyncio.run(drive(url, model, rate, count, seed, args, offset))


# The measuring client runs in a process of its own: in the server's process its receive
# loop shared the GIL with the server's and the coordinator's threads, so a chunk could
# wait there after it left, and the client's underruns read up to 248 ms off the server's.
CLIENT: ProcessPoolExecutor | None = None


def measure(url: str, model: str, rate: float, count: int, seed: int, args: Any,
            offset: int) -> tuple[list[RequestRecord], list[float]]:
    if CLIENT is None:
        return drive_apart(url, model, rate, count, seed, args, offset)
    return CLIENT.submit(drive_apart, url, model, rate, count, seed, args, offset).result()


def run_configs(topology: str | None, model_path: str | None, configs: list[str], rates: list[float],
                args: Any, slo: AudioSlo,
                measured: Callable[[str, float, RateFigures], None] = lambda *_: None,
                started: Callable[[str, dict[str, int]], None] = lambda *_: None,
                ) -> dict[str, dict[float, RateFigures]]:
    """Every configuration's server up at once, and each rate run on them in turn (the order
    turned by one each rate): on a machine shared with other work, the load changes from
    minute to minute, and configs run one after the other met different machines.
    ``measured(config, rate, figures)`` is called as each is done, ``started(config, pids)``
    with each server's stage processes once it is up."""
    from omnictl.serving.background import BackgroundServer
    from omnictl.serving.config import HttpConfig, ServeConfig
    from omnictl.serving.server import Listening

    device = serve_device(args.device, model_path)
    results: dict[str, dict[float, RateFigures]] = {config: {} for config in configs}
    with contextlib.ExitStack() as servers:

        def start(config: str) -> Listening:
            run_dir = None if args.run_dir is None else str(args.run_dir / config.replace("+", "-"))
            serving = ServeConfig(topology=topology, http=HttpConfig(port=0),
                                  max_underrun_ms=args.admit_ms if CONFIGS[config] else None).launching(
                model_path=model_path, max_in_flight=None, device=device, audio_policy=config.split("+")[0],
                run_dir=run_dir, request_timeout=600.0, ready_timeout=600.0)  # a busy shared machine loads slowly
            return servers.enter_context(BackgroundServer(serving))

        # On a GPU (its machine's many cores) the servers start side by side: their stage
        # processes import and load at once, the wait nearer the slowest server's than the sum
        # (each server has its own thread and loop; all are registered to be stopped before an
        # error from any is raised here). On the CPU one after the other: on two busy cores side
        # by side was slower (50 s against 36 s, the median of three each, load 6 to 12). And
        # only with --run-dir: the default run directory is named by the second and the pid,
        # and two launched in one second would share one.
        side_by_side = args.device.startswith("cuda") and args.run_dir is not None
        with ThreadPoolExecutor(max_workers=len(configs) if side_by_side else 1) as starting:
            starts = {config: starting.submit(start, config) for config in configs}
        up: dict[str, tuple[str, str, Path]] = {}
        for config in configs:
            listening = starts[config].result()
            up[config] = listening.url, listening.state.model_name, Path(listening.pipeline.run_dir)
            started(config, listening.pipeline.process_ids())
            measure(up[config][0], up[config][1], 1.0, args.warmup, 99, args, 10_000)  # compile, load, warm
        for index, rate in enumerate(rates):
            for config in configs[index % len(configs):] + configs[: index % len(configs)]:
                url, model, run_dir = up[config]
                # the seed is the rate's, not the config's: every config gets the same arrivals
                records, refusals = measure(url, model, rate, args.requests, args.seed + index, args, 100 * index)
                ids = {r.request_id for r in records if r.request_id}
                f = results[config][rate] = RateFigures(rate, records, refusals, server_underruns(run_dir, ids))
                _, misses = judge(records, slo, duration=1.0)
                for placed in where_late(run_dir, misses, wait_s=0.5):
                    where = f"{placed['reason']} at {placed['stage']} {placed['part']}"
                    f.late_at[where] = f.late_at.get(where, 0) + 1
                audio = [r.continuity() for r in f.played()]
                mean_s = sum(c.audio_s for c in audio) / len(audio) if audio else 0.0
                mean_chunks = sum(c.chunks for c in audio) / len(audio) if audio else 0.0
                unplayed = f.summary()
                why = (f" ({len(unplayed['failed'])} failed, {unplayed['without_audio']} without audio)"
                       if len(f.played()) < len(records) else "")
                print(f"  {config:<15} {rate:5.2f}/s  done {len(f.played())}/{len(records)}{why}  "
                      f"p95 underrun {ms(f.underrun(95))}  TTFP p90 {ms(f.ttfp(90))}  "
                      f"audio {mean_s:.1f} s in {mean_chunks:.1f} chunks a stream  "
                      f"(load average {os.getloadavg()[0]:.1f})", flush=True)
                measured(config, rate, f)
    return {config: dict(sorted(figures.items())) for config, figures in results.items()}


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def highest_sustained(figures: dict[float, RateFigures]) -> float | None:
    """The highest rate up to which every rate kept p95 largest underrun within 100 ms."""
    best = None
    for rate in sorted(figures):
        if not figures[rate].sustained():
            break
        best = rate
    return best


def report(name: str, results: dict[str, dict[float, RateFigures]], slo: AudioSlo) -> list[tuple[str, bool]]:
    print(f"\n{name}: per rate (client receive clock)")
    header = (f"{'config':<15} {'rate/s':>6} {'TTFP p50':>9} {'TTFP p90':>9} {'under p50':>9} {'under p95':>9} "
              f"{'cont@100':>8} {'goodput':>8} {'refused':>7} {'srv-cli':>8}")
    print(header)
    for config, figures in results.items():
        for rate, f in figures.items():
            summary, _ = judge(f.records, slo, duration=1.0)
            cont = f.continuity()
            refused = sum(r.overloaded for r in f.records)
            print(f"{config:<15} {rate:>6.2f} {ms(f.ttfp(50)):>9} {ms(f.ttfp(90)):>9} {ms(f.underrun(50)):>9} "
                  f"{ms(f.underrun(95)):>9} {'-' if cont is None else f'{cont:.0%}':>8} {summary['share']:>8.0%} "
                  f"{refused:>7} {ms(f.disagreement()):>8}")
    print(f"\n{name}: where the late chunks of the requests missing the SLO spent the most time (profiler)")
    for config, figures in results.items():
        late: dict[str, int] = defaultdict(int)
        for f in figures.values():
            for where, count in f.late_at.items():
                late[where] += count
        held = ", ".join(f"{where}: {count}" for where, count in sorted(late.items(), key=lambda kv: -kv[1]))
        print(f"  {config:<15} {held or 'none missed'}")
    sustained = {config: highest_sustained(figures) for config, figures in results.items()}
    for config, rate in sustained.items():
        print(f"{name}: {config} sustains {'no rate tried' if rate is None else f'{rate:g}/s'} "
              f"(p95 largest underrun <= {SUSTAIN_S * 1000:.0f} ms)")
    goals: list[tuple[str, bool]] = []
    if not {"fifo", "deadline"} <= set(results):
        return goals  # a pilot of some configs: figures only
    fifo, deadline = sustained["fifo"], sustained["deadline"]
    rates = sorted(results["fifo"])
    if fifo is None:
        ratio_met = deadline is not None
        ttfp_met = ratio_met
    else:
        ratio_met = deadline is not None and deadline >= 1.5 * fifo
        at = results["deadline"][fifo].ttfp(90), results["fifo"][fifo].ttfp(90)
        ttfp_met = at[0] is not None and at[1] is not None and at[0] <= at[1]
    goals.append((f"{name}: deadline sustains >= 1.5x fifo's rate ({deadline} vs {fifo} /s)", ratio_met))
    goals.append((f"{name}: deadline's TTFP p90 no worse than fifo's at fifo's sustained rate", ttfp_met))
    worst = max((d for figures in results.values() for f in figures.values() if (d := f.disagreement()) is not None),
                default=None)
    agree = (f"{name}: the server's underrun within 50 ms of the client's per stream (worst {ms(worst)})",
             worst is not None and worst <= AGREE_S)
    if "deadline+admit" not in results:
        return [*goals, agree]  # fifo against deadline alone: admission is not judged
    base = max(x for x in (fifo, deadline, rates[0]) if x is not None)
    over = min((r for r in rates if r >= 2 * base), default=rates[-1])
    admitted = results["deadline+admit"][over]
    p95 = admitted.underrun(95)
    refusals = [s for f in results["deadline+admit"].values() for s in f.refusal_s]
    short = "" if over >= 2 * base else f"; 2x would be {2 * base:g}/s, past the rates tried"
    goals.append((f"{name}: with admission, admitted streams' p95 largest underrun <= 100 ms at {over:g}/s "
                  f"(2x the sustainable {base:g}/s{short}): {ms(p95)}",
                  p95 is not None and p95 <= SUSTAIN_S and over >= 2 * base))
    slowest = max(refusals) if refusals else None
    goals.append((f"{name}: refusals answered in < 50 ms ({len(refusals)} refused, slowest {ms(slowest)})",
                  slowest is None or slowest < REFUSE_S))
    return [*goals, agree]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topology", default="voice", help="voice, qwen or voice,qwen")
    parser.add_argument("--rates", default=None, help="arrivals per second, comma-separated (default per topology)")
    parser.add_argument("--requests", type=int, default=16, help="requests per rate")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="of fifo, deadline, deadline+admit")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=4, help="voice: sentences asked for per answer")
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument("--max-codes", type=int, default=96, help="qwen: codec frames per answer")
    parser.add_argument("--admit-ms", type=float, default=100.0, help="--max-underrun-ms of deadline+admit")
    parser.add_argument("--slo-ttfp", type=float, default=3.0, help="seconds")
    parser.add_argument("--slo-underrun", type=float, default=0.1, help="seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="qwen: cpu (the topology's GPU placement dropped) or cuda")
    parser.add_argument("--size", default="mid", help="qwen: the random-weight checkpoint written: tiny, mid or real "
                                                    "(default mid)")
    parser.add_argument("--model-path", help="qwen: a Qwen3-Omni checkpoint directory instead of writing one")
    parser.add_argument("--json", type=Path, help="write the figures, sustained rates and goals to this file, "
                                                  "rewritten after every rate")
    parser.add_argument("--run-dir", type=Path, help="keep each server's run directory (profile, stage logs) "
                                                     "under this one (default: the user state dir)")
    parser.add_argument("--server-nice", type=int, default=0,
                        help="run the server and its stages this much nicer than the measuring client")
    args = parser.parse_args()
    global CLIENT
    CLIENT = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
    CLIENT.submit(int).result()  # started now, before the server side is made nicer
    if args.server_nice:
        os.nice(args.server_nice)  # this process and the stage processes it starts; not the client
    if args.device.startswith("cuda") and not _cuda_available():
        parser.error("--device cuda: torch sees no CUDA GPU")
    defaults = {"voice": "0.1,0.2,0.4", "qwen": "0.25,0.5,1.0"}
    slo = AudioSlo(args.slo_ttfp, args.slo_underrun)
    goals: list[tuple[str, bool]] = []
    document: dict[str, Any] = {"device": args.device, "requests": args.requests, "topologies": {}}

    def save() -> None:
        if args.json is not None:
            args.json.write_text(json.dumps(document, indent=2) + "\n")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for name in [t.strip() for t in args.topology.split(",") if t.strip()]:
            if name not in defaults:
                parser.error(f"--topology takes voice and/or qwen, got {name!r}")
            rates = [float(r) for r in (args.rates or defaults[name]).split(",")]
            if name == "voice":
                topology, model_path = voice_topology(Path(scratch), args.sentences, args.max_tokens), None
            else:
                topology, model_path = qwen_topology(Path(scratch), args.max_codes, args.size, args.model_path,
                                                     args.device)
            print(f"{name}: rates {rates} /s, {args.requests} requests each, the same arrival schedule per config "
                  f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; the client in its own process, "
                  f"the server side at nice +{args.server_nice})",
                  flush=True)
            configs = [c.strip() for c in args.configs.split(",") if c.strip()]
            unknown = [c for c in configs if c not in CONFIGS]
            if unknown:
                parser.error(f"--configs takes {', '.join(CONFIGS)}, got {', '.join(unknown)}")
            part: dict[str, Any] = {"rates": {c: {} for c in configs}, "stage_pids": {}}
            document["topologies"][name] = part

            def measured(config: str, rate: float, figures: RateFigures, part: dict[str, Any] = part) -> None:
                part["rates"][config][str(rate)] = figures.summary()
                save()

            def started(config: str, pids: dict[str, int], part: dict[str, Any] = part) -> None:
                part["stage_pids"][config] = pids  # GPU memory sampled by pid is placed by these
                save()

            results = run_configs(topology, model_path, configs, rates, args, slo, measured, started)
            judged = report(name, results, slo)
            part["sustained_per_s"] = {config: highest_sustained(figures) for config, figures in results.items()}
            part["goals"] = [{"goal": text, "met": met} for text, met in judged]
            save()
            goals += judged
    print(f"\n({time.perf_counter() - began:.0f} s in all; load average at the end "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores)")
    for text, met in goals:
        print(f"goal {text}: {'met' if met else 'NOT met'}")
    CLIENT.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The chaos soak's server and load: a real ``omnictl serve`` with replicas and restarts,
closed-loop clients whose every request ends as one outcome, and the SIGKILLs."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.chaos_leaks import Watch, alive, get_health, parent_of
from benchmarks.chaos_stages import echo_text

REPO = Path(__file__).resolve().parents[1]
MODEL = "chaos"
_URL = re.compile(r"listening on (http://\S+)")
_REFUSED_PAUSE_S = 0.1  # a client's pause after a 503 (the server refused it at the door)
_NUMBERS = itertools.count(1)  # request numbers (and ids) unique across warm-up and soak


@dataclass
class SoakConfig:
    seconds: float = 60.0
    kill_every: float = 5.0
    concurrency: int = 8
    replicas: int = 2  # of the entry process; the other gets one more, so placements do not pair in lockstep
    warmup_s: float = 3.0
    request_deadline_s: float = 30.0  # the client's: no outcome by then is a hang
    request_timeout_s: float = 20.0  # the server's (--request-timeout): shorter, so it answers first
    settle_s: float = 60.0  # after the run: how long processes may take to be back and idle
    max_restarts: int = 100_000
    replay_limit: int = 1  # --replay-limit: 0 fails every request a killed replica held, as before replays
    # the share of requests that ask for text alone, streamed: front -> answer (autoregressive) only,
    # so a kill mid-answer resumes it elsewhere with the tokens its client has forced
    text_only: float = 0.3
    seed: int | None = None
    work_dir: Path | None = None  # server output and run directory; a temporary one if None


@dataclass
class Outcomes:
    sent: int = 0
    completed: int = 0
    failed: collections.Counter[str] = field(default_factory=collections.Counter)  # why -> count
    wrong: list[str] = field(default_factory=list)  # request ids answered with another answer
    hung: list[str] = field(default_factory=list)  # request ids with no outcome by the deadline
    # failures of streamed requests whose client had already received output (the server
    # cannot replay those: an audio stream cannot resume; a text-only stream of the
    # autoregressive answer resumes instead): the rest had shown nothing yet
    failed_after_output: int = 0
    # refused at admission (503: every replica of some process down at that moment, none
    # admitted, so none replayable); counted among the failures before output
    refused: int = 0
    # text-only streamed requests: id -> (the clean greedy text, the joined stream, or None if it failed)
    text_streams: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    @property
    def failed_before_output(self) -> int:
        """Failures of requests whose client had received nothing: what a replay should save."""
        return self.failed_total - self.failed_after_output

    @property
    def deadline_ended(self) -> int:
        """Failures that were the server's own request timeout: a request that hung inside
        until its deadline, not one that failed at once (see _why)."""
        return sum(n for why, n in self.failed.items() if why.endswith(" deadline"))


def write_topology(directory: Path, replicas: int) -> Path:
    """Two processes: ``front`` with ``replicas``, ``heads`` (``answer``, autoregressive, and
    ``speak``) with one more (placement rotates
    ties per process: equal counts would pair front#i with heads#i only, and the warm-up would
    not open every connection). 1 MiB slots, 2 of them, so that at the soak's concurrency
    some payloads take a segment of their own (the other shared-memory path)."""
    knobs = {"slot_bytes": 1 << 20, "slots": 2}
    stages = [
        {"name": "front", "factory": "benchmarks.chaos_stages.front", "next": ["answer", "speak"], "relay": knobs},
        {"name": "answer", "factory": "benchmarks.chaos_stages.answer", "process": "heads", "terminal": True,
         "modality": "text", "relay": knobs},
        {"name": "speak", "factory": "benchmarks.chaos_stages.speak", "process": "heads", "terminal": True,
         "modality": "audio", "relay": knobs},
    ]
    document = {"name": MODEL, "stages": stages,
                "processes": {"front": {"replicas": replicas}, "heads": {"replicas": replicas + 1}}}
    path = directory / "chaos.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    output: Path

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return -9


def start_server(config: SoakConfig, work_dir: Path, ready_timeout: float = 180.0) -> Server:
    topology = write_topology(work_dir, config.replicas)
    output = work_dir / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "omnictl.cli.main", "serve", str(topology), "--port", "0", "--no-dashboard",
               "--max-restarts", str(config.max_restarts), "--request-timeout", str(config.request_timeout_s),
               "--replay-limit", str(config.replay_limit),
               "--run-dir", str(work_dir / "run"), "--log-level", "warning"]
    with open(output, "wb") as sink:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        found = _URL.search(output.read_text(errors="replace"))
        if found:
            return Server(process, found.group(1), output)
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    process.wait()
    raise RuntimeError(f"omnictl serve did not start; its output:\n{output.read_text(errors='replace')}")


def _body(number: int, words: list[str], stream: bool, text_only: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "stream": stream, "modalities": ["text"] if text_only else ["text", "audio"],
                            "messages": [{"role": "user", "content": f"chaos {number}: {' '.join(words)}"}]}
    if not text_only:
        body["audio"] = {"format": "pcm16"}
    return body


def _why(status: int, body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return f"{status}"
    message = str(error.get("message", ""))
    if "missed its deadline" in message:  # the server's request timeout: something inside hung
        return f"{status} deadline"
    return f"{status} {error.get('code') or error.get('type')}"


async def _streamed(client: httpx.AsyncClient, url: str, rid: str, body: dict[str, Any]) -> tuple[str, str]:
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}) as response:
        if response.status_code != 200:
            raw = await response.aread()
            return "failed", _why(response.status_code, _json(raw))
        text: list[str] = []
        audio = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":  # the text, if the audio asked for came too
                return "done", "".join(text) if audio or body["modalities"] == ["text"] else ""
            event = json.loads(line[6:])
            if "error" in event:
                return ("failed after output" if any(text) or audio else "failed"), _why(200, event)
            for choice in event.get("choices", ()):
                delta = choice.get("delta", {})
                text.append(delta.get("content") or "")
                audio += bool(delta.get("audio"))
        return ("failed after output" if any(text) or audio else "failed"), "stream cut (no [DONE])"


async def _whole(client: httpx.AsyncClient, url: str, rid: str, body: dict[str, Any]) -> tuple[str, str]:
    response = await client.post(url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid})
    if response.status_code != 200:
        return "failed", _why(response.status_code, _json(response.content))
    message = response.json()["choices"][0]["message"]
    return "done", (message.get("content") or "") if message.get("audio") else ""


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


async def load_loop(url: str, until: float, outcomes: Outcomes, config: SoakConfig, rng: random.Random) -> None:
    """``config.concurrency`` clients, each sending its next request when the last one ended."""
    limits = httpx.Limits(max_connections=config.concurrency + 4, max_keepalive_connections=config.concurrency + 4)

    async def client_loop(client: httpx.AsyncClient) -> None:
        while time.monotonic() < until:
            number = next(_NUMBERS)
            words = [rng.choice(("owl", "river", "lamp", "stone", "cloud", "maple")) for _ in range(rng.randint(3, 9))]
            text_only = rng.random() < config.text_only
            stream = text_only or rng.random() < 0.5
            rid = f"chaos-{number}"
            outcomes.sent += 1
            call = _streamed if stream else _whole
            clean = echo_text(words)
            if text_only:
                outcomes.text_streams[rid] = (clean, None)
            try:
                kind, detail = await asyncio.wait_for(call(client, url, rid, _body(number, words, stream, text_only)),
                                                      config.request_deadline_s)
            except asyncio.TimeoutError:
                outcomes.hung.append(rid)
                continue
            except httpx.HTTPError as exc:  # the server closed the connection: an outcome, not a hang
                outcomes.failed[f"connection: {type(exc).__name__}"] += 1
                continue
            if kind.startswith("failed"):
                outcomes.failed[detail] += 1
                outcomes.failed_after_output += kind == "failed after output"
                if detail.startswith("503 "):
                    # as a client honouring a 503 would, it waits before its next request: a
                    # closed loop answered in a millisecond would count one outage thousands of times
                    outcomes.refused += 1
                    await asyncio.sleep(_REFUSED_PAUSE_S)
                continue
            if text_only:
                outcomes.text_streams[rid] = (clean, detail)
            if detail == clean:
                outcomes.completed += 1
            else:
                outcomes.wrong.append(rid)

    async with httpx.AsyncClient(timeout=config.request_deadline_s + 5, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(config.concurrency)))


async def watch_loop(url: str, until: float, watch: Watch) -> None:
    async with httpx.AsyncClient() as client:
        while time.monotonic() < until:
            try:
                watch.see(await get_health(client, url))
            except httpx.HTTPError:
                pass  # the next poll sees it
            await asyncio.sleep(0.25)


async def kill_loop(url: str, started: float, until: float, every: float, watch: Watch, rng: random.Random,
                    kills: list[tuple[float, str, int]]) -> None:
    """Every ``every`` seconds, SIGKILL one stage process (a replica), chosen at random among
    all of them: one still starting after its last kill included."""
    async with httpx.AsyncClient() as client:
        while time.monotonic() + every < until:
            await asyncio.sleep(every)
            health = await get_health(client, url)
            watch.see(health)
            candidates = sorted((name, pid) for name, pid in health["processes"].items()
                                if parent_of(pid) == watch.server_pid and alive(pid))
            if not candidates:
                continue
            name, pid = rng.choice(candidates)
            os.kill(pid, signal.SIGKILL)
            kills.append((time.monotonic() - started, name, pid))

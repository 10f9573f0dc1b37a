"""A spoken turn's milestones, end to end: a real `omnictl serve` of the fast topology (the
run's one, shared), the official `openai` client speaking to it over `/v1/realtime` with the
server's VAD deciding the turn; then the turn's milestones in the run's trace (and `omnictl
trace <item id>`), and in `/metrics`, each in the order the turn reached it."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.store import TraceStore
from tests.serving.harness import API_KEY, ServerProcess
from tests.serving.realtime.speech import chunks, collect_until_done, sample, silence

# The fast topology hears the audio itself (no transcript terminal): no transcript_final. The
# answer starts at the pause that ends the question (preempted) and is submitted while the VAD
# waits out the silence; it is released when the turn is confirmed.
SPOKEN_TURN = ["preempted", "speech_stopped", "turn_confirmed", "response_started", "first_token", "first_clause",
               "first_audio_sent"]
# The fast topology writes its text and speaks in two stages at once: the first token and the
# first clause may come in either order, but each follows the response's start. Held until the
# turn is confirmed, they are stamped when they came (before or after the confirmation); the
# first audio is sent only once it is confirmed.
IN_ORDER = (
    ("preempted", "response_started", "first_token"),
    ("preempted", "response_started", "first_clause", "first_audio_sent"),
    ("preempted", "speech_stopped", "turn_confirmed", "first_audio_sent"),
)


def happened(event: Event) -> int:
    """When a milestone happened: it is recorded ``ago_s`` later when read late (a held answer's)."""
    return event.ts - int(float(event.meta.get("ago_s", 0)) * 1e9)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def run_dir(server: ServerProcess) -> Path:
    """Where the run's one fast server (tests/serving/conftest.py's ``server``) records its
    traces: a server profiles, in a run folder of its own when none is given; /health says which."""
    health = httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).json()
    assert health["run_dir"] is not None, health
    return Path(health["run_dir"])


def milestones(run_dir: Path, turn_id: str, count: int, timeout: float = 20.0) -> list[Event]:
    """The turn's milestone events once ``count`` are in the store (the recorder ships in batches)."""
    deadline = time.monotonic() + timeout
    while True:
        events = [e for e in TraceStore(run_dir).events(turn_id) if e.kind is EventKind.TURN_MILESTONE]
        if len(events) >= count or time.monotonic() > deadline:
            return events
        time.sleep(0.1)


def turn_seconds(metrics: str) -> dict[str, tuple[float, float]]:
    """milestone -> (count, sum) of omnictl_realtime_turn_seconds."""
    found: dict[str, dict[str, float]] = {}
    for part, milestone, value in re.findall(
        r'^omnictl_realtime_turn_seconds_(count|sum)\{milestone="(\w+)"\} (\S+)$', metrics, re.M
    ):
        found.setdefault(milestone, {})[part] = float(value)
    return {m: (v["count"], v["sum"]) for m, v in found.items()}


def metered(server: ServerProcess) -> dict[str, tuple[float, float]]:
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).text
    return turn_seconds(text)


def test_a_spoken_turns_milestones_are_in_the_trace_and_metrics_in_order(server: ServerProcess, run_dir: Path) -> None:
    before = metered(server)  # the server is shared: this turn's are what it adds
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    with client.realtime.connect(model="fast") as connection:
        created = connection.recv()
        assert created.type == "session.created" and created.session.audio.input.turn_detection.type == "server_vad"
        connection.session.update(session={"type": "realtime", "output_modalities": ["text", "audio"]})
        assert connection.recv().type == "session.updated"
        for audio in chunks(silence(300) + sample("sky_colour") + silence(1200)):
            connection.input_audio_buffer.append(audio=audio)
        events = collect_until_done(connection)
    stopped = next(e for e in events if e.type == "input_audio_buffer.speech_stopped")
    assert events[-1].response.status == "completed"
    assert any(e.type == "response.output_audio.delta" for e in events)

    recorded = sorted(milestones(run_dir, stopped.item_id, len(SPOKEN_TURN)), key=happened)
    order = [e.meta["milestone"] for e in recorded]  # in the order they happened, as the trace lists them
    assert sorted(order) == sorted(SPOKEN_TURN), order  # each once
    for chain in IN_ORDER:
        assert [m for m in order if m in chain] == list(chain), order
    since = {str(e.meta["milestone"]): float(e.meta["since_stop_s"]) for e in recorded}  # type: ignore[arg-type]
    assert since["preempted"] == 0.0 and 0 < since["first_audio_sent"] < 10, since  # from the pause
    requests = {e.meta.get("request") for e in recorded if e.meta["milestone"] not in ("preempted", "speech_stopped")}
    requests.discard(None)
    assert len(requests) == 1 and next(iter(requests)).startswith("resp_req"), requests  # the response's request

    after = metered(server)
    seconds = {m: (count - before.get(m, (0, 0))[0], total - before.get(m, (0, 0))[1])
               for m, (count, total) in after.items()}
    assert [m for m in SPOKEN_TURN if seconds.get(m, (0, 0))[0] == 1] == SPOKEN_TURN, seconds
    for chain in IN_ORDER:
        sums = [seconds[m][1] for m in chain]
        assert sums == sorted(sums), (chain, sums)
    assert seconds["first_audio_sent"][1] == pytest.approx(since["first_audio_sent"], abs=1e-3)

    from omnictl.cli.main import app  # `omnictl trace <item id>` draws the turn

    result = CliRunner().invoke(app, ["trace", stopped.item_id, "--run-dir", str(run_dir)], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert f"turn {stopped.item_id}" in result.output
    names = [m.group(1) for m in re.finditer(r"^  [A-Z] (.+?) \+", result.output, re.M)]
    assert names == [m.replace("_", " ") for m in order], result.output


def test_a_turn_transcribed_while_spoken_marks_its_final_transcript() -> None:
    """The live transcription's final transcript is the turn's ``transcript_final``, between its
    commit and the answer (the session over a live transcriber's test double)."""
    from tests.profiling.test_turn_milestones import Recorded
    from tests.serving.realtime.test_live_transcription import Client, run

    async def scenario() -> None:
        client = Client()
        recorded = Recorded([0])
        client.state.profiler = recorded
        for _ in range(3):
            await client.append(0.1)
        await client.send({"type": "input_audio_buffer.commit"})
        await client.settle()
        await client.send({"type": "response.create"})
        await client.settle()
        [committed] = client.of("input_audio_buffer.committed")
        assert {e.request_id for e in recorded.events} == {committed["item_id"]}
        assert [e.meta["milestone"] for e in recorded.events] == [
            "turn_confirmed", "transcript_final", "response_started", "first_token"]

    run(scenario)

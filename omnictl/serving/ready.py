"""What ``omnictl serve`` prints once it is ready: where it listens and a request to paste."""

from __future__ import annotations

import json
import shlex
from typing import Mapping

from rich.console import Group, RenderableType
from rich.text import Text

from omnictl.serving.common.capabilities import Capabilities

EXAMPLE_QUESTION = "What is the capital of France?"
EXAMPLE_SPEECH = "Hello! This is omnictl speaking."
# The spoken question shipped in the package: a file a transcription request can send from any directory.
EXAMPLE_RECORDING = "capital_of_france.wav"
# An error answer (a wrong key, a server still starting) prints the server's own words, not a traceback.
_SAVE_ANSWER = (
    'import sys, json, base64; r = json.load(sys.stdin); e = r.get("error"); '
    'e and sys.exit("error: " + e["message"]); m = r["choices"][0]["message"]; print(m["content"]); '
    'a = m.get("audio"); a and open("answer.wav", "wb").write(base64.b64decode(a["data"])); '
    'a and print("spoken answer saved to answer.wav")'
)


def example_body(model: str, modalities: list[str]) -> dict[str, object]:
    body: dict[str, object] = {
        "model": model,
        "modalities": modalities,
        "messages": [{"role": "user", "content": EXAMPLE_QUESTION}],
    }
    if "audio" in modalities:
        body["audio"] = {"format": "wav"}
    return body


def example_curl(url: str, model: str, terminals: Mapping[str, str], api_key: str | None) -> str:
    """A shell command that asks a question and, with audio, saves the spoken answer as answer.wav."""
    modalities = [m for m in ("text", "audio") if m in terminals.values()] or sorted(set(terminals.values()))
    body = shlex.quote(json.dumps(example_body(model, modalities), separators=(",", ":")))
    return (
        f"curl -s {url}/v1/chat/completions -H 'Content-Type: application/json'{_auth(api_key)} -d {body}"
        f" | python3 -c {shlex.quote(_SAVE_ANSWER)}"
    )


def speech_curl(url: str, model: str, api_key: str | None) -> str:
    """A shell command that asks ``/v1/audio/speech`` to say :data:`EXAMPLE_SPEECH` and saves
    it as speech.wav, printing the status and size (an error's body lands in the file: the
    status says so)."""
    body = shlex.quote(
        json.dumps({"model": model, "input": EXAMPLE_SPEECH, "response_format": "wav"}, separators=(",", ":"))
    )
    write_out = shlex.quote("HTTP %{http_code}: %{size_download} bytes saved to speech.wav\\n")
    return (
        f"curl -s {url}/v1/audio/speech -H 'Content-Type: application/json'{_auth(api_key)} -d {body}"
        f" -o speech.wav -w {write_out}"
    )


def transcription_curl(url: str, model: str, api_key: str | None) -> str:
    """A shell command that sends the packaged spoken question to ``/v1/audio/transcriptions``
    (its path in full, so it runs from any directory) and prints the JSON answer."""
    from omnictl.data import SAMPLES, data_path

    recording = data_path(SAMPLES) / EXAMPLE_RECORDING
    return (
        f"curl -s {url}/v1/audio/transcriptions{_auth(api_key)} -F model={shlex.quote(model)}"
        f" -F file=@{shlex.quote(str(recording))}"
    )


def _auth(api_key: str | None) -> str:
    # The key itself is never printed (terminals and logs are read by others): the command
    # reads it from the environment.
    return ' -H "Authorization: Bearer $OMNICTL_API_KEY"' if api_key else ""


def try_it(url: str, model: str, terminals: Mapping[str, str], api_key: str | None, serves: Capabilities) -> str:
    """The one request to paste, for a route the topology serves: a question in chat
    completions when it answers in text (or speaks, and does not take text to speak); text
    to speak when it is a speech synthesizer (CSM); a recording when it only transcribes
    (Qwen3-ASR); for a full-duplex model (Moshi), where the session is, in words."""
    if serves.full_duplex:  # no one request: a session of streamed audio (Moshi), which a curl cannot hold
        return (
            f"a full-duplex session at {url.replace('http', 'ws', 1)}/v1/realtime: stream audio in with "
            "input_audio_buffer.append, audio and text stream out (a client: docs/models/moshi.md)"
        )
    if serves.chat and ("text" in terminals.values() or not serves.speech):
        return example_curl(url, model, terminals, api_key)
    if serves.speech:
        return speech_curl(url, model, api_key)
    if serves.transcription:
        return transcription_curl(url, model, api_key)
    return example_curl(url, model, terminals, api_key)  # serves no route of the API: the closest ask


def _served_by(terminals: Mapping[str, str]) -> Capabilities:
    """What the terminals alone say (a caller without the topology): chat with a text or audio one."""
    modalities = set(terminals.values())
    return Capabilities(
        chat=bool({"text", "audio"} & modalities), speech=False, transcription="transcript" in modalities
    )


def ready_message(
    url: str,
    model: str,
    terminals: Mapping[str, str],
    stages: int,
    processes: int,
    api_key: str | None,
    run_dir: str | None = None,
    program: str = "omnictl",
    serves: Capabilities | None = None,
) -> RenderableType:
    """``program``: how to type omnictl here (``.venv/bin/omnictl`` when the venv is not
    active), so the suggested commands paste as they are. ``serves``: the routes the topology
    serves (:func:`omnictl.serving.common.capabilities.capabilities`; default: what the
    terminals alone say), which decide the request to paste and whether the playground is
    offered."""
    serves = serves if serves is not None else _served_by(terminals)
    produces = ", ".join(sorted(set(terminals.values())))
    # The playground is a conversation in turns over /v1/realtime: offered where the model
    # answers chat in text (a speech synthesizer such as CSM serves the route, but only says
    # what it is given; a full-duplex model refuses turns).
    playground = (
        [Text.assemble("  playground at ", (url + "/", "bold cyan"), "  (talk to it in a browser, over /v1/realtime)")]
        if serves.chat and "text" in terminals.values()
        else []
    )
    traces = (
        [Text.assemble("  traces in ", (run_dir, "bold"), f"  ({program} trace REQUEST_ID finds a request there)")]
        if run_dir
        else []
    )
    return Group(
        Text.assemble(
            ("omnictl serve", "bold green"),
            f": {model} ({_count(stages, 'stage')} in {_count(processes, 'process')}; produces {produces})",
        ),
        Text.assemble(
            "  listening on ", (url, "bold cyan"), "  (OpenAI API at /v1, health at /health, metrics at /metrics)"
        ),
        *playground,
        Text("  try it:", style="bold"),
        Text("  " + try_it(url, model, terminals, api_key, serves)),
        Text.assemble("  load-test it: ", (f"{program} bench --url {url}", "bold")),
        *traces,
        Text("  Ctrl-C stops the server and every stage process.", style="dim"),
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"

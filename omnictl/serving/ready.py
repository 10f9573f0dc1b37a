"""What ``omnictl serve`` prints once it is ready: where it listens and a request to paste."""

from __future__ import annotations

import json
import shlex
from typing import Mapping

from rich.console import Group, RenderableType
from rich.text import Text

EXAMPLE_QUESTION = "What is the capital of France?"
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
    # The key itself is never printed (terminals and logs are read by others): the command
    # reads it from the environment.
    auth = ' -H "Authorization: Bearer $OMNICTL_API_KEY"' if api_key else ""
    body = shlex.quote(json.dumps(example_body(model, modalities), separators=(",", ":")))
    return (
        f"curl -s {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d {body}"
        f" | python3 -c {shlex.quote(_SAVE_ANSWER)}"
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
) -> RenderableType:
    """``program``: how to type omnictl here (``.venv/bin/omnictl`` when the venv is not
    active), so the suggested commands paste as they are."""
    produces = ", ".join(sorted(set(terminals.values())))
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
        Text.assemble("  playground at ", (url + "/", "bold cyan"), "  (talk to it in a browser, over /v1/realtime)"),
        Text("  try it:", style="bold"),
        Text("  " + example_curl(url, model, terminals, api_key)),
        Text.assemble("  load-test it: ", (f"{program} bench --url {url}", "bold")),
        *traces,
        Text("  Ctrl-C stops the server and every stage process.", style="dim"),
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"

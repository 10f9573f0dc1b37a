"""What ``omnictl serve`` prints once it is ready (omnictl.serving.ready): the example request
body, the curl command to paste (its modalities, its auth header, its shell quoting, the
python3 snippet that saves the spoken answer), and the ready message as a console shows it.
In the test process; the commands are parsed with shlex and the snippet run for real."""

from __future__ import annotations

import base64
import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console, Group
from rich.text import Text

from omnictl.serving.common.capabilities import Capabilities
from omnictl.serving.ready import (
    EXAMPLE_QUESTION,
    EXAMPLE_SPEECH,
    example_body,
    example_curl,
    ready_message,
    speech_curl,
    transcription_curl,
    try_it,
)

URL = "http://127.0.0.1:8000"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def curl_words(command: str) -> list[str]:
    """The command as the shell splits it."""
    return shlex.split(command)


def rendered(message: object) -> list[str]:
    """The message's lines as a 400-column terminal shows them (printed as ``omnictl serve`` does)."""
    console = Console(width=400, record=True, file=io.StringIO())
    console.print(message, soft_wrap=True)
    return console.export_text().splitlines()


def answer_json(content: str, audio: bytes | None) -> str:
    message: dict[str, object] = {"role": "assistant", "content": content}
    if audio is not None:
        message["audio"] = {"id": "audio_1", "data": base64.b64encode(audio).decode(), "transcript": content}
    return json.dumps({"id": "chatcmpl-1", "choices": [{"index": 0, "message": message}]})


# --- the request body ---------------------------------------------------------------------


def test_the_example_body_asks_the_question_in_the_modalities_given() -> None:
    assert EXAMPLE_QUESTION == "What is the capital of France?"
    assert example_body("voice", ["text"]) == {"model": "voice", "modalities": ["text"], "messages": QUESTION}
    assert example_body("m", []) == {"model": "m", "modalities": [], "messages": QUESTION}


def test_with_audio_the_body_asks_for_a_wav_answer_after_the_messages() -> None:
    body = example_body("voice", ["text", "audio"])
    assert body == {"model": "voice", "modalities": ["text", "audio"], "messages": QUESTION, "audio": {"format": "wav"}}
    assert list(body) == ["model", "modalities", "messages", "audio"]
    assert example_body("voice", ["audio"])["audio"] == {"format": "wav"}
    assert "audio" not in example_body("voice", ["audios", "text"])  # a modality named audio, not one containing it


# --- the curl command ---------------------------------------------------------------------


def test_the_curl_command_is_these_words_to_the_shell() -> None:
    command = example_curl(URL, "voice", {"reply": "text"}, None)
    body = json.dumps(example_body("voice", ["text"]), separators=(",", ":"))
    save = curl_words(command)[-1]
    assert curl_words(command) == [
        "curl",
        "-s",
        "http://127.0.0.1:8000/v1/chat/completions",
        "-H",
        "Content-Type: application/json",
        "-d",
        body,
        "|",
        "python3",
        "-c",
        save,
    ]
    assert command.startswith(
        "curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{"
    )
    assert f" -d {shlex.quote(body)} | python3 -c {shlex.quote(save)}" in command
    assert (
        body
        == '{"model":"voice","modalities":["text"],"messages":[{"role":"user","content":"What is the capital of France?"}]}'
    )


@pytest.mark.parametrize(
    ("terminals", "modalities"),
    [
        ({"reply": "text", "speech": "audio"}, ["text", "audio"]),
        ({"speech": "audio", "reply": "text"}, ["text", "audio"]),  # text first, whatever the terminals' order
        ({"speech": "audio"}, ["audio"]),
        ({"reply": "text", "picture": "image"}, ["text"]),  # what chat completions return: the rest is left out
        ({"picture": "image", "vector": "embedding", "thumb": "image"}, ["embedding", "image"]),  # else all, sorted
        ({}, []),
    ],
)
def test_the_modalities_asked_for_come_from_what_the_terminals_produce(
    terminals: dict[str, str], modalities: list[str]
) -> None:
    words = curl_words(example_curl(URL, "voice", terminals, None))
    assert json.loads(words[words.index("-d") + 1]) == example_body("voice", modalities)


def test_the_body_survives_the_shell_whatever_the_model_is_called() -> None:
    for model in ("it's", 'say "hi"', "a b  c", "$HOME `id` \\n"):
        command = example_curl(URL, model, {"reply": "text", "speech": "audio"}, None)
        words = curl_words(command)
        assert json.loads(words[words.index("-d") + 1]) == example_body(model, ["text", "audio"]), model


def test_with_a_key_the_command_reads_it_from_the_environment_and_never_shows_it() -> None:
    command = example_curl(URL, "voice", {"reply": "text"}, "sk-secret-4242")
    assert "sk-secret-4242" not in command
    assert ' -H "Authorization: Bearer $OMNICTL_API_KEY" -d ' in command  # double quotes: the shell fills it in
    words = curl_words(command)
    assert words[:7] == [
        "curl",
        "-s",
        "http://127.0.0.1:8000/v1/chat/completions",
        "-H",
        "Content-Type: application/json",
        "-H",
        "Authorization: Bearer $OMNICTL_API_KEY",
    ]
    assert words[7] == "-d"
    for key in (None, ""):  # an empty key is no key: no header to send
        assert "Authorization" not in example_curl(URL, "voice", {"reply": "text"}, key)


# --- the python3 snippet that reads the answer -----------------------------------------------


def run_snippet(command: str, answer: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    snippet = curl_words(command)[-1]
    return subprocess.run(
        [sys.executable, "-c", snippet], input=answer, cwd=cwd, capture_output=True, text=True, timeout=30, check=True
    )


def test_the_snippet_prints_the_answer_and_saves_the_spoken_one_as_answer_wav(tmp_path: Path) -> None:
    wav = b"RIFF\x24\x00\x00\x00WAVEfmt \x00\xff\x01binary"
    done = run_snippet(example_curl(URL, "voice", {"speech": "audio"}, None), answer_json("Paris.", wav), tmp_path)
    assert done.stdout == "Paris.\nspoken answer saved to answer.wav\n"
    assert done.stderr == ""
    assert (tmp_path / "answer.wav").read_bytes() == wav
    assert sorted(os.listdir(tmp_path)) == ["answer.wav"]


def test_a_text_only_answer_is_printed_and_no_file_written(tmp_path: Path) -> None:
    done = run_snippet(example_curl(URL, "voice", {"reply": "text"}, None), answer_json("Paris.", None), tmp_path)
    assert done.stdout == "Paris.\n"
    assert os.listdir(tmp_path) == []


def test_an_error_answer_prints_the_server_s_words_not_a_traceback(tmp_path: Path) -> None:
    command = example_curl(URL, "voice", {"reply": "text"}, "sk-x")
    error = json.dumps(
        {
            "error": {
                "message": "missing or wrong API key (send 'Authorization: Bearer <key>')",
                "type": "authentication_error",
                "code": "invalid_api_key",
            }
        }
    )
    snippet = curl_words(command)[-1]
    done = subprocess.run(
        [sys.executable, "-c", snippet], input=error, cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "error: missing or wrong API key (send 'Authorization: Bearer <key>')\n"
    assert os.listdir(tmp_path) == []


def test_the_whole_command_runs_in_a_shell_with_the_key_from_the_environment(tmp_path: Path) -> None:
    """bash runs the pasted line: a stand-in curl records its arguments and answers."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wav = b"RIFF-spoken-answer"
    (tmp_path / "answer.json").write_text(answer_json("Paris, of course.", wav))
    curl = bin_dir / "curl"
    curl.write_text('#!/bin/sh\nfor arg in "$@"; do printf "%s\\n" "$arg"; done > "$ARGS_FILE"\ncat "$ANSWER_FILE"\n')
    curl.chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "OMNICTL_API_KEY": "sk-from-env",
        "ARGS_FILE": str(tmp_path / "args.txt"),
        "ANSWER_FILE": str(tmp_path / "answer.json"),
    }
    work = tmp_path / "work"
    work.mkdir()
    command = example_curl(URL, "it's voice", {"speech": "audio", "reply": "text"}, "sk-not-printed")
    done = subprocess.run(
        ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout == "Paris, of course.\nspoken answer saved to answer.wav\n"
    assert (work / "answer.wav").read_bytes() == wav
    args = (tmp_path / "args.txt").read_text().splitlines()
    assert args[:6] == [
        "-s",
        "http://127.0.0.1:8000/v1/chat/completions",
        "-H",
        "Content-Type: application/json",
        "-H",
        "Authorization: Bearer sk-from-env",
    ]
    assert args[6] == "-d" and json.loads(args[7]) == example_body("it's voice", ["text", "audio"])
    assert len(args) == 8


# --- the ready message ------------------------------------------------------------------------


def test_the_ready_message_names_the_model_the_urls_and_the_commands_to_paste() -> None:
    terminals = {"speech": "audio", "reply": "text", "speech2": "audio"}
    curl = example_curl(URL, "voice", terminals, "sk-x")
    lines = rendered(ready_message(URL, "voice", terminals, 3, 4, "sk-x", "/runs/r1", program=".venv/bin/omnictl"))
    assert lines == [
        "omnictl serve: voice (3 stages in 4 processes; produces audio, text)",
        "  listening on http://127.0.0.1:8000  (OpenAI API at /v1, health at /health, metrics at /metrics)",
        "  playground at http://127.0.0.1:8000/  (talk to it in a browser, over /v1/realtime)",
        "  try it:",
        "  " + curl,
        "  load-test it: .venv/bin/omnictl bench --url http://127.0.0.1:8000",
        "  traces in /runs/r1  (.venv/bin/omnictl trace REQUEST_ID finds a request there)",
        "  Ctrl-C stops the server and every stage process.",
    ]
    assert "sk-x" not in "\n".join(lines)


def test_without_a_run_dir_there_is_no_traces_line_and_the_program_is_omnictl() -> None:
    lines = rendered(ready_message("http://[::1]:9000", "m", {"out": "text"}, 1, 1, None))
    assert lines == [
        "omnictl serve: m (1 stage in 1 process; produces text)",
        "  listening on http://[::1]:9000  (OpenAI API at /v1, health at /health, metrics at /metrics)",
        "  playground at http://[::1]:9000/  (talk to it in a browser, over /v1/realtime)",
        "  try it:",
        "  " + example_curl("http://[::1]:9000", "m", {"out": "text"}, None),
        "  load-test it: omnictl bench --url http://[::1]:9000",
        "  Ctrl-C stops the server and every stage process.",
    ]
    assert rendered(ready_message(URL, "m", {"out": "text"}, 1, 1, None, "")) == rendered(
        ready_message(URL, "m", {"out": "text"}, 1, 1, None, None)
    )


def test_the_printed_curl_line_is_the_command_itself() -> None:
    """Pasting the printed line (less its indent) sends the example body."""
    terminals = {"reply": "text", "speech": "audio"}
    lines = rendered(ready_message(URL, "voice", terminals, 2, 2, "k"))
    printed = lines[4]
    assert printed.startswith("  curl ")
    words = curl_words(printed)
    assert json.loads(words[words.index("-d") + 1]) == example_body("voice", ["text", "audio"])
    assert words[words.index("|") :][:3] == ["|", "python3", "-c"]


def test_the_names_and_commands_to_copy_stand_out() -> None:
    message = ready_message(URL, "voice", {"reply": "text"}, 1, 1, None, "/runs/r1", program="omni")
    assert isinstance(message, Group)
    texts = list(message.renderables)
    assert all(isinstance(text, Text) for text in texts)

    def emphasis(text: object) -> tuple[str, list[tuple[str, str]]]:
        assert isinstance(text, Text)
        return str(text.style), [(text.plain[span.start : span.end], str(span.style)) for span in text.spans]

    assert [emphasis(text) for text in texts] == [
        ("", [("omnictl serve", "bold green")]),
        ("", [("http://127.0.0.1:8000", "bold cyan")]),
        ("", [("http://127.0.0.1:8000/", "bold cyan")]),
        ("bold", []),
        ("", []),
        ("", [("omni bench --url http://127.0.0.1:8000", "bold")]),
        ("", [("/runs/r1", "bold")]),
        ("dim", []),
    ]


# --- a request for a route the topology serves --------------------------------------------


def test_a_speech_synthesizer_is_asked_to_speak_and_offered_no_playground() -> None:
    """CSM: every terminal audio, /v1/audio/speech served; chat would only make it say the question."""
    csm = Capabilities(chat=True, speech=True, transcription=False)
    lines = rendered(ready_message(URL, "csm", {"mimi_decoder": "audio"}, 5, 2, "sk-x", serves=csm))
    assert not any("playground" in line for line in lines)
    command = lines[lines.index("  try it:") + 1].strip()
    assert command == speech_curl(URL, "csm", "sk-x")
    words = curl_words(command)
    assert words[:2] == ["curl", "-s"] and words[2] == f"{URL}/v1/audio/speech"
    assert json.loads(words[words.index("-d") + 1]) == {"model": "csm", "input": EXAMPLE_SPEECH, "response_format": "wav"}
    assert words[words.index("-o") + 1] == "speech.wav" and "Authorization: Bearer $OMNICTL_API_KEY" in words


def test_a_recognizer_is_sent_the_packaged_recording_from_any_directory() -> None:
    """Qwen3-ASR: a transcript terminal only; no chat, no realtime, no playground."""
    asr = Capabilities(chat=False, speech=False, transcription=True)
    lines = rendered(ready_message(URL, "qwen3-asr", {"transcript": "transcript"}, 4, 2, None, serves=asr))
    assert not any("playground" in line or "chat/completions" in line for line in lines)
    words = curl_words(lines[lines.index("  try it:") + 1])
    assert words[2] == f"{URL}/v1/audio/transcriptions" and "model=qwen3-asr" in words
    recording = Path(words[words.index("-F", words.index("model=qwen3-asr")) + 1].removeprefix("file=@"))
    assert recording.is_absolute() and recording.is_file() and recording.suffix == ".wav"
    assert transcription_curl(URL, "qwen3-asr", None) == lines[lines.index("  try it:") + 1].strip()


def test_a_model_that_answers_in_text_is_asked_a_question_whatever_else_it_serves() -> None:
    everything = Capabilities(chat=True, speech=True, transcription=True)  # the voice assistant
    terminals = {"decode": "text", "tts": "audio", "transcript": "transcript"}
    assert try_it(URL, "voice", terminals, None, everything) == example_curl(URL, "voice", terminals, None)
    lines = rendered(ready_message(URL, "voice", terminals, 6, 4, None, serves=everything))
    assert any(line.startswith("  playground at ") for line in lines)
    audio_only_chat = Capabilities(chat=True, speech=False, transcription=False)
    assert try_it(URL, "m", {"wav": "audio"}, None, audio_only_chat) == example_curl(URL, "m", {"wav": "audio"}, None)


# A stand-in curl: writes RIFF to -o's file and prints -w's format as curl would for a 200 of 4 bytes.
CURL_WRITING_OUT = r"""#!/bin/sh
out=''; format=''
while [ $# -gt 0 ]; do
  case $1 in -o) out=$2; shift;; -w) format=$2; shift;; esac
  shift
done
printf RIFF > "$out"
printf '%s' "$format" | sed -e 's/%{http_code}/200/' -e 's/%{size_download}/4/' -e 's/[\]n$//'
echo
"""


def test_the_speech_command_saves_the_audio_and_says_what_came_back(tmp_path: Path) -> None:
    """bash runs the pasted speech line against a stand-in curl that honours -o and -w."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    curl = bin_dir / "curl"
    curl.write_text(CURL_WRITING_OUT)
    curl.chmod(0o755)
    done = subprocess.run(["bash", "-c", speech_curl(URL, "csm", None)], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, timeout=30, check=True)
    assert done.stdout == "HTTP 200: 4 bytes saved to speech.wav\n"
    assert (tmp_path / "speech.wav").read_bytes() == b"RIFF"


def test_a_full_duplex_model_is_pointed_at_its_session_and_offered_no_playground() -> None:
    """Moshi: /v1/realtime only, in its duplex mode; a chat curl would be a 404, the
    turn-based playground refused."""
    duplex = Capabilities(chat=False, speech=False, transcription=False, full_duplex=True)
    lines = rendered(ready_message(URL, "moshi", {"text": "text", "mimi_decoder": "audio"}, 5, 2, None, serves=duplex))
    assert not any("playground" in line or "curl" in line for line in lines)
    assert "ws://127.0.0.1:8000/v1/realtime" in lines[lines.index("  try it:") + 1]

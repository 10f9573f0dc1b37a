"""How often the voice assistant's Whisper (base) translates spoken French, German and
Spanish into English: the quality figure tests/serving/test_audio_parity.py no longer
asserts (a weak model's words on speech made at test time depend on the machine's
espeak-ng and on luck; the test checks the mechanism on recorded clips instead).

Speaks each sentence of ``SENTENCES`` with espeak-ng in its language at several speeds (the
audio is made at run time, so this figure moves with the machine's espeak-ng), and
translates every clip with the embedded topology's ``asr`` settings (beam 5, temperature
0, no fallback; the language detected, as a /v1/audio/translations request leaves it),
side by side with the same settings told the source language (what detection costs). A
clip counts as translated when the English holds
every keyword the sentence's translation must have; it is also told apart when Whisper
answered in the source language (the flaky test's failure) rather than in wrong English.

Prints, per setting and language: clips translated / clips, those left in the source
language, those whose language was detected wrong, and each miss with what Whisper wrote
and the language it heard; then whether the goal is met: at least 80 % of the clips
translated as a request is (the language detected).

Run: ``python benchmarks/translation_quality.py [--quick] [--speeds 120,140,160] [--json]``

Measured (``--quick``, espeak-ng 1.51, 2 shared CPU cores, 2026-12-07): 4 of 15 clips
translated (27 %: de 1/5, fr 1/5, es 2/5), 4 of 15 with the source language given, so
detection is not what fails; Whisper base mostly writes fluent wrong English for espeak's
short sentences. Goal not met: the figure to beat with a bigger Whisper.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the omnictl of this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from omnictl.data import data_path
from omnictl.inputs import RecognitionOptions
from omnictl.models.voice_assistant.asr import SpeechRecognizer
from omnictl.serving.transcriptions.audiofile import decode_audio_file

GOAL = 0.8  # of the clips translated with the topology's settings

# (espeak-ng voice, sentence, English keywords its translation must hold)
SENTENCES: list[tuple[str, str, tuple[str, ...]]] = [
    ("de", "Guten Morgen. Ich möchte eine Tasse Kaffee, bitte.", ("morning", "coffee")),
    ("de", "Wie spät ist es jetzt?", ("time",)),
    ("de", "Das Wetter ist heute sehr schön.", ("weather", "today")),
    ("de", "Wo ist der Bahnhof?", ("station",)),
    ("de", "Ich habe zwei Katzen und einen Hund.", ("two", "cats", "dog")),
    ("fr", "Bonjour. Je voudrais un café, s'il vous plaît.", ("morning", "coffee")),
    ("fr", "Quelle heure est-il?", ("time",)),
    ("fr", "Il fait très beau aujourd'hui.", ("today",)),
    ("fr", "Où est la gare?", ("station",)),
    ("fr", "J'ai deux chats et un chien.", ("two", "cats", "dog")),
    ("es", "Buenos días. Quiero una taza de café, por favor.", ("morning", "coffee")),
    ("es", "¿Qué hora es?", ("time",)),
    ("es", "Hoy hace muy buen tiempo.", ("today", "weather")),
    ("es", "¿Dónde está la estación de tren?", ("station",)),
    ("es", "Tengo dos gatos y un perro.", ("two", "cats", "dog")),
]
SOURCE_WORDS = {  # a word of the source language Whisper keeps when it did not translate
    "de": ("ich", "ist", "und", "der", "guten", "das"),
    "fr": ("je", "est", "et", "la", "bonjour", "il"),
    "es": ("quiero", "es", "y", "la", "buenos", "tengo"),
}


def topology_settings() -> dict[str, Any]:
    """The embedded topology's asr factory_args that decoding reads (not the clip padding
    of its short-window path, which translations never take)."""
    topology = yaml.safe_load(data_path("voice-assistant.yaml").read_text(encoding="utf-8"))
    (asr,) = [stage for stage in topology["stages"] if stage["name"] == "asr"]
    args = asr["factory_args"]
    return {"beam_size": args["beam_size"], "temperatures": args["temperatures"], "vad_filter": args["vad_filter"]}


def speak(voice: str, text: str, speed: int) -> bytes:
    return subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(speed), "--stdout", text], capture_output=True, check=True, timeout=60
    ).stdout


def judge(text: str, keywords: tuple[str, ...], voice: str) -> str:
    words = [w.strip(".,!?¿¡'\"").lower() for w in text.split()]
    if all(any(word.startswith(k) for word in words) for k in keywords):
        return "translated"
    if sum(word in SOURCE_WORDS[voice] for word in words) >= 2:
        return "source language"
    return "wrong English"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speeds", default="120,140,160", help="espeak-ng words per minute, comma-separated")
    parser.add_argument("--quick", action="store_true", help="one speed, 130 (15 clips, not 45)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    if args.quick:
        args.speeds = "130"
    if shutil.which("espeak-ng") is None:
        print("translation_quality: espeak-ng is not installed (scripts/setup.sh installs it)", file=sys.stderr)
        return 2
    speeds = [int(s) for s in args.speeds.split(",")]
    topology = topology_settings()
    recognizer = SpeechRecognizer(**topology)
    settings = {"language detected (as a request)": False, "source language given": True}
    options = RecognitionOptions(task="translate")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
    for voice, sentence, keywords in SENTENCES:
        for speed in speeds:
            samples, rate = decode_audio_file(speak(voice, sentence, speed), "file", 600)
            for name, given in settings.items():  # side by side: the same clip, the same load
                started = time.perf_counter()
                segments, heard = recognizer.decode(samples, rate, voice if given else None, options)
                text = "".join(segment.text for segment in segments).strip()
                results[name].append(
                    {
                        "voice": voice,
                        "speed": speed,
                        "sentence": sentence,
                        "heard_language": heard,
                        "text": text,
                        "verdict": judge(text, keywords, voice),
                        "seconds": round(time.perf_counter() - started, 3),
                    }
                )
    if args.json:
        print(json.dumps(results, indent=1, ensure_ascii=False))
    else:
        for name, rows in results.items():
            print(f"{name}:")
            for voice in sorted({row["voice"] for row in rows}):
                mine = [row for row in rows if row["voice"] == voice]
                good = sum(row["verdict"] == "translated" for row in mine)
                kept = sum(row["verdict"] == "source language" for row in mine)
                misheard = sum(row["heard_language"] != voice for row in mine)
                print(
                    f"  {voice}: {good}/{len(mine)} translated, {kept} left in {voice}, language heard wrong {misheard}"
                )
            for row in rows:
                if row["verdict"] != "translated":
                    print(
                        f"    miss ({row['verdict']}, heard {row['heard_language']}): {row['voice']} -s {row['speed']} "
                        f"{row['sentence']!r} -> {row['text']!r}"
                    )
    rows = results["language detected (as a request)"]
    share = sum(row["verdict"] == "translated" for row in rows) / len(rows)
    met = share >= GOAL
    print(
        f"goal: >= {GOAL:.0%} of {len(rows)} clips translated as a request is: {share:.0%}, "
        f"{'met' if met else 'not met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

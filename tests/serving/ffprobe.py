"""ffprobe (Debian's ffmpeg package) as the tests' independent judge of encoded audio."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

FFPROBE = shutil.which("ffprobe")
FFMPEG = shutil.which("ffmpeg")
needs_ffmpeg = pytest.mark.skipif(FFPROBE is None or FFMPEG is None,
                                  reason="ffprobe/ffmpeg not installed (apt-get install ffmpeg; .ci/run does)")
CODEC_NAMES = {"mp3": "mp3", "opus": "opus", "aac": "aac", "flac": "flac", "wav": "pcm_s16le"}


def probe(data: bytes) -> tuple[str, float]:
    """(codec name, seconds) of an audio file: the end of its last packet, which needs no
    header total (a streamed FLAC or MP3 has none)."""
    assert FFPROBE is not None
    out = subprocess.run([FFPROBE, "-v", "error", "-select_streams", "a:0", "-show_entries",
                          "stream=codec_name:packet=pts_time,duration_time", "-of", "json", "-"],
                         input=data, capture_output=True, check=True, timeout=60)
    info = json.loads(out.stdout)
    packets = [p for p in info["packets"] if "pts_time" in p]
    assert packets, f"ffprobe found no packets: {out.stderr.decode()}"
    last = max(packets, key=lambda p: float(p["pts_time"]))
    return info["streams"][0]["codec_name"], float(last["pts_time"]) + float(last.get("duration_time", 0))


def convert(data: bytes, suffix: str, *args: str) -> bytes:
    """``data`` (any audio) re-encoded by the ffmpeg command line into the container ``suffix``."""
    assert FFMPEG is not None
    with tempfile.TemporaryDirectory() as folder:  # a file: the m4a muxer seeks back to its header
        target = Path(folder) / f"audio.{suffix}"
        subprocess.run([FFMPEG, "-v", "error", "-i", "-", *args, str(target)], input=data, capture_output=True,
                       check=True, timeout=60)
        return target.read_bytes()

from __future__ import annotations

import base64

from omnictl.bench.workload import build_payload, spoken_samples, tone_wav


def test_mixed_alternates_text_and_rotating_spoken_questions() -> None:
    wavs = [b"RIFF-one", b"RIFF-two"]
    payloads = [build_payload(i, "mixed", ["text", "audio"], 16, wavs, "m") for i in range(4)]
    contents = [p["messages"][0]["content"] for p in payloads]
    assert isinstance(contents[0], str) and isinstance(contents[2], str) and contents[0] != contents[2]
    sent = [base64.b64decode(c[0]["input_audio"]["data"]) for c in (contents[1], contents[3])]
    assert sent == wavs
    assert all(p["stream"] and p["audio"] == {"format": "pcm16"} and p["max_tokens"] == 16 for p in payloads)


def test_text_only_requests_ask_for_no_audio() -> None:
    payload = build_payload(0, "text", ["text"], None, [tone_wav()], "m")
    assert "audio" not in payload and "max_tokens" not in payload and payload["modalities"] == ["text"]


def test_the_package_ships_spoken_questions() -> None:
    samples = spoken_samples()
    assert samples and all(s[:4] == b"RIFF" for s in samples)

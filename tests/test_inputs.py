"""omnictl.inputs: every bad part is named; good audio decodes to the right samples; the
typed request crosses processes intact; entry stages take the typed request or the dict."""

from __future__ import annotations

import base64
import io
import struct
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnictl.exceptions import InvalidRequest, PayloadTooLarge
from omnictl.inputs import (
    AudioPart,
    ChatMessage,
    ChatRequest,
    ImagePart,
    SamplingParams,
    TextPart,
    as_chat_request,
    decode_audio,
    load_image,
    parse_request,
    read_wav,
    request_params,
    resample,
)
from omnictl.transports.packing import pack, unpack

RATE = 16_000
PNG_1PX = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def tone(seconds: float = 0.25, rate: int = RATE, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def wav_bytes(samples: np.ndarray, rate: int = RATE, channels: int = 1) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def float_wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    body = samples.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    return b"RIFF" + struct.pack("<I", 4 + 8 + 16 + 8 + len(body)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(body)) + body


def audio_part(data: Any, fmt: str = "wav", **extra: Any) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt, **extra}}


def request(*parts: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}], **top}


def field_of(inputs: Any) -> str | None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(inputs)
    assert caught.value.field is not None
    assert str(caught.value).startswith(caught.value.field)  # the message leads with the part it names
    return caught.value.field


def test_text_and_wav_parts_parse_into_typed_parts() -> None:
    samples = tone()
    parsed = parse_request(request(audio_part(base64.b64encode(wav_bytes(samples)).decode())))
    message = parsed.messages[0]
    assert message.role == "user"
    assert message.parts[0] == TextPart(text="hi")
    audio = message.parts[1]
    assert isinstance(audio, AudioPart)
    assert audio.sample_rate == RATE
    assert audio.field == "messages[0].content[1].input_audio"
    np.testing.assert_allclose(audio.samples, samples, atol=1 / 16000)
    assert parsed.last_user_message() is message
    assert message.text() == "hi"


def test_string_content_system_and_sampling() -> None:
    parsed = parse_request(
        {
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
            "sampling": {"max_tokens": 8, "temperature": 0, "top_p": 0.9, "top_k": 5, "seed": 3, "stop": "\n"},
            "voice": "joe",
        }
    )
    assert [m.text() for m in parsed.messages] == ["be brief", "hello"]
    assert parsed.sampling.max_tokens == 8 and parsed.sampling.temperature == 0.0
    assert parsed.sampling.stop == ("\n",) and parsed.sampling.top_k == 5 and parsed.sampling.seed == 3
    assert parsed.voice == "joe"


def test_pcm16_defaults_to_24khz_and_numpy_arrays_to_16khz() -> None:
    pcm = (tone(rate=24_000) * 32767).astype("<i2").tobytes()
    parsed = parse_request(request(audio_part(base64.b64encode(pcm).decode(), "pcm16"), audio_part(tone(), "wav")))
    pcm_part, array_part = parsed.messages[0].parts[1:]
    assert isinstance(pcm_part, AudioPart) and pcm_part.sample_rate == 24_000
    assert isinstance(array_part, AudioPart) and array_part.sample_rate == RATE
    assert pcm_part.samples.size == tone(rate=24_000).size


def test_int16_numpy_array_is_scaled() -> None:
    parsed = parse_request(request(audio_part(np.array([16384, -32768], dtype=np.int16), sample_rate=8000)))
    part = parsed.messages[0].parts[1]
    assert isinstance(part, AudioPart) and part.sample_rate == 8000
    np.testing.assert_allclose(part.samples, [0.5, -1.0])


@pytest.mark.parametrize(
    ("inputs", "field"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x", "colour": 1}]}, "messages[0].colour"),
        (request({"type": "video"}), "messages[0].content[1].type"),
        (request({"type": "text", "text": 5}), "messages[0].content[1].text"),
        (request(audio_part("!!not base64!!")), "messages[0].content[1].input_audio.data"),
        (request(audio_part(base64.b64encode(b"not a wav file").decode())), "messages[0].content[1].input_audio.data"),
        (request(audio_part("AAAA", "mp3")), "messages[0].content[1].input_audio.format"),
        (request(audio_part(base64.b64encode(b"\x00\x01\x02").decode(), "pcm16")), "messages[0].content[1].input_audio.data"),
        (request(audio_part(np.zeros((2, 100), dtype=np.float32))), "messages[0].content[1].input_audio.data"),
        (request(audio_part(np.array([np.nan], dtype=np.float32))), "messages[0].content[1].input_audio.data"),
        (request(audio_part(np.zeros(0, dtype=np.float32))), "messages[0].content[1].input_audio.data"),
        (request(audio_part(np.zeros(10, dtype=np.int64))), "messages[0].content[1].input_audio.data"),
        (request(audio_part(12)), "messages[0].content[1].input_audio.data"),
        (request(audio_part(tone(), sample_rate=True)), "messages[0].content[1].input_audio.sample_rate"),
        (request({"type": "input_audio"}), "messages[0].content[1].input_audio"),
        (request({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}), "messages[0].content[1].image_url.url"),
        (request({"type": "image_url", "image_url": {"url": "/no/such/image.png"}}), "messages[0].content[1].image_url.url"),
        (request({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}), "messages[0].content[1].image_url.url"),
        (request({"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}), "messages[0].content[1].image_url.url"),
        (request({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}), "messages[0].content[1].image_url.url"),
        (request({"type": "image_url", "image_url": "x.png"}), "messages[0].content[1].image_url"),
        (request(sampling={"temperature": -1}), "sampling.temperature"),
        (request(sampling={"temperature": True}), "sampling.temperature"),
        (request(sampling={"top_p": 0}), "sampling.top_p"),
        (request(sampling={"max_tokens": 0}), "sampling.max_tokens"),
        (request(sampling={"max_tokens": 2.5}), "sampling.max_tokens"),
        (request(sampling={"top_k": -1}), "sampling.top_k"),
        (request(sampling={"seed": "1"}), "sampling.seed"),
        (request(sampling={"stop": ["ok", ""]}), "sampling.stop[1]"),
        (request(sampling={"temprature": 0.5}), "sampling.temprature"),
        (request(sampling=[1]), "sampling"),
        (request(voice=""), "voice"),
        (request(speed=0.1), "speed"),
        (request(speed=True), "speed"),
        (request(speed="fast"), "speed"),
        (request(colour="red"), "inputs.colour"),
    ],
)
def test_bad_input_names_the_part(inputs: Any, field: str) -> None:
    assert field_of(inputs) == field


def test_second_message_part_is_named_with_its_indices() -> None:
    inputs = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": "b"}, audio_part("%%")]}]}
    assert field_of(inputs) == "messages[1].content[1].input_audio.data"


def test_wav_reader_handles_float_stereo_and_streamed_sizes() -> None:
    samples = tone(rate=8000)
    decoded, rate = read_wav(float_wav_bytes(samples, 8000))
    assert rate == 8000
    np.testing.assert_allclose(decoded, samples, atol=1e-7)

    stereo = np.stack([samples, -samples * 0 + 0.25], axis=1).reshape(-1)
    decoded, _ = read_wav(wav_bytes(stereo, rate=8000, channels=2))
    np.testing.assert_allclose(decoded, (samples + 0.25) / 2, atol=2e-4)

    # A streamed WAV (sizes marked unknown) holds everything after its header.
    whole = bytearray(wav_bytes(samples))
    whole[40:44] = b"\xff\xff\xff\xff"
    decoded, _ = read_wav(bytes(whole))
    assert decoded.size == samples.size


def test_resample_keeps_a_tone_and_removes_what_the_target_cannot_hold() -> None:
    low = tone(seconds=1.0, rate=22_050, hz=440.0)
    down = decode_audio(AudioPart(samples=low, sample_rate=22_050, field="x"), RATE)
    assert down.size == RATE
    spectrum = np.abs(np.fft.rfft(down))
    assert abs(int(np.argmax(spectrum)) - 440) <= 1  # 1 Hz bins over one second
    np.testing.assert_allclose(np.abs(down[2000:-2000]).max(), 0.5, atol=0.01)

    high = tone(seconds=1.0, rate=44_100, hz=12_000.0)  # above the 8 kHz Nyquist of a 16 kHz target
    assert np.abs(resample(high, 44_100, RATE)[2000:-2000]).max() < 0.02
    assert resample(low, 22_050, 22_050) is low


@pytest.mark.parametrize(("size", "rate", "target"), [(16_000, 16_000, 24_000), (7, 44_100, 16_000), (0, 48_000, 16_000),
                                                      (384_000, 384_000, 16_000), (1001, 24_000, 8_000)])
def test_resample_gives_the_length_the_ratio_says_in_float32(size: int, rate: int, target: int) -> None:
    out = resample(np.zeros(size, np.float32), rate, target)
    assert out.dtype == np.float32 and out.size == round(size * target / rate)


def test_a_wav_over_the_decode_budget_is_refused_before_it_is_converted() -> None:
    """Issue 40: a duration within the limit in 8 channels at 384 kHz is 24 times the work
    of stereo at 48 kHz; the budget (decode_budget) counts every channel."""
    many = wav_bytes(np.zeros(int(0.1 * 384_000) * 8, np.float32), rate=384_000, channels=8)
    encoded = base64.b64encode(many).decode()
    request = {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": encoded}}]}]}
    with pytest.raises(InvalidRequest) as error:
        parse_request(request, max_audio_seconds=1.0)
    assert type(error.value) is InvalidRequest and error.value.field == "messages[0].content[0].input_audio.data"
    assert "WAV data holds 307,200 samples (8 channel(s) at 384000 Hz); the limit is 96,000 decoded samples" in str(
        error.value)
    assert parse_request(request, max_audio_seconds=4.0).messages[0].parts[0].sample_rate == 384_000  # under it


def test_image_parts_from_data_url_and_path(tmp_path: Path) -> None:
    path = tmp_path / "pixel.png"
    path.write_bytes(PNG_1PX)
    url = "data:image/png;base64," + base64.b64encode(PNG_1PX).decode()
    parsed = parse_request(request({"type": "image_url", "image_url": {"url": url}}, {"type": "image_url", "image_url": {"url": str(path)}}),
                           local_images=True)
    from_url, from_path = parsed.messages[0].parts[1:]
    assert isinstance(from_url, ImagePart) and from_url.data == PNG_1PX
    assert isinstance(from_path, ImagePart) and from_path.path == str(path)
    pil = pytest.importorskip("PIL")
    assert pil is not None
    assert load_image(from_url).size == (1, 1)
    assert load_image(from_path).mode == "RGB"


def test_an_oversized_audio_part_is_refused_before_it_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = base64.b64decode
    monkeypatch.setattr(base64, "b64decode", lambda data, *a, **k: calls.append(len(data)) or real(data, *a, **k))
    inputs = request(audio_part(base64.b64encode(bytes(2000)).decode(), "pcm16"))
    with pytest.raises(PayloadTooLarge) as caught:
        parse_request(inputs, max_audio_bytes=1000)
    assert caught.value.field == "messages[0].content[1].input_audio.data" and calls == []
    assert parse_request(inputs, max_audio_bytes=2000).messages[0].audio()[0].samples.size == 1000


def typed_request() -> ChatRequest:
    wav = base64.b64encode(wav_bytes(tone())).decode()
    url = "data:image/png;base64," + base64.b64encode(PNG_1PX).decode()
    return parse_request({
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, audio_part(wav), {"type": "image_url", "image_url": {"url": url}}]},
        ],
        "sampling": {"max_tokens": 8, "temperature": 0, "stop": ["\n", "."]},
        "voice": "joe",
    })


def test_a_typed_request_crosses_processes_as_the_same_types() -> None:
    sent = typed_request()
    packed = pack({"request": sent})
    assert len(packed.layout) == 1  # the samples travel as a raw buffer, not inside msgpack
    assert b"pickle" not in packed.skeleton and b"numpy" not in packed.skeleton
    got = unpack(packed.skeleton, packed.layout, packed.to_bytes())["request"]
    assert type(got) is ChatRequest and type(got.sampling) is SamplingParams
    assert got.sampling == sent.sampling and got.sampling.stop == ("\n", ".")  # a tuple again, not a list
    assert isinstance(got.messages, tuple) and all(type(m) is ChatMessage for m in got.messages)
    assert [type(p) for p in got.messages[1].parts] == [TextPart, AudioPart, ImagePart]
    audio, sent_audio = got.messages[1].audio()[0], sent.messages[1].audio()[0]
    assert (audio.sample_rate, audio.field) == (sent_audio.sample_rate, sent_audio.field)
    assert audio.samples.dtype == np.float32
    np.testing.assert_array_equal(audio.samples, sent_audio.samples)
    image = got.messages[1].parts[2]
    assert isinstance(image, ImagePart) and image.data == PNG_1PX and image.path is None
    assert got.params() == sent.params()


def test_as_chat_request_takes_the_typed_request_or_the_dict() -> None:
    typed = typed_request()
    assert as_chat_request(typed) is typed  # already parsed: nothing decoded again
    parsed = as_chat_request({"messages": [{"role": "user", "content": "hello"}], "sampling": {"max_tokens": 3}})
    assert isinstance(parsed, ChatRequest) and parsed.messages[0].text() == "hello" and parsed.sampling.max_tokens == 3
    with pytest.raises(InvalidRequest) as caught:
        as_chat_request({"messages": [{"role": "user", "content": [audio_part("%%")]}]})
    assert caught.value.field == "messages[0].content[0].input_audio.data"
    for garbage, named in (("hello", "got str"), (["messages"], "got list"), (None, "got null"), (42, "got int")):
        with pytest.raises(InvalidRequest) as caught:
            as_chat_request(garbage)
        assert caught.value.field == "inputs" and str(caught.value).endswith(named)


def test_request_params_are_what_stages_read_and_msgpack_plain() -> None:
    import msgspec

    params = request_params(typed_request())
    assert params == {"sampling": {"max_tokens": 8, "temperature": 0.0, "stop": ["\n", "."]}, "voice": "joe"}
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params)) == params  # a control-plane message
    assert request_params(parse_request({"messages": [{"role": "user", "content": "x"}]})) == {"sampling": {}}
    # A dict's are passed on as given (the stages validate them), as before; anything else has none.
    assert request_params({"text": "x", "sampling": {"top_k": 2}, "voice": "v"}) == {"sampling": {"top_k": 2}, "voice": "v"}
    assert request_params({"text": "x"}) == {} and request_params("text") == {}
    # A speaking speed reaches the stages only when it asks for something (the TTS applies it).
    fast = parse_request({"messages": [{"role": "user", "content": "x"}], "speed": 1.5})
    assert fast.speed == 1.5 and request_params(fast) == {"sampling": {}, "speed": 1.5}
    assert ChatRequest(messages=fast.messages, speed=2).speed == 2.0  # an int is taken as a float


def test_the_request_types_check_themselves_and_are_frozen() -> None:
    with pytest.raises(InvalidRequest) as caught:
        ChatMessage(role="robot")
    assert caught.value.field == "role"
    with pytest.raises(InvalidRequest, match="1-D float32"):
        AudioPart(samples=np.zeros((2, 3), dtype=np.float32), sample_rate=RATE, field="a")
    with pytest.raises(InvalidRequest) as caught:
        AudioPart(samples=tone(), sample_rate=0, field="a")
    assert caught.value.field == "a.sample_rate"
    with pytest.raises(InvalidRequest) as caught:
        ChatRequest(messages=[])
    assert caught.value.field == "messages"
    with pytest.raises(InvalidRequest):
        ImagePart(field="img")
    message = ChatMessage(role="user", parts=[TextPart(text="hi")])
    assert message.parts == (TextPart(text="hi"),)
    with pytest.raises(AttributeError):
        message.role = "assistant"  # type: ignore[misc]


def test_one_definition_of_formats_and_roles() -> None:
    from omnictl.serving.speech import encode as audio
    from omnictl.serving.chat import protocol

    # Input audio formats (input_audio parts) are inputs'; the answer's (audio.format) are
    # what the encoders produce, defined once in serving.audio.
    assert protocol.OUTPUT_FORMATS is audio.FORMATS and not hasattr(protocol, "AUDIO_FORMATS")
    assert not hasattr(protocol, "_ROLES") and not hasattr(protocol, "ROLES")


def test_a_wav_header_outside_the_sample_rate_bounds_is_refused() -> None:
    lying = wav_bytes(tone(seconds=0.01))
    lying = lying[:24] + struct.pack("<I", 1) + lying[28:]  # the fmt chunk's sample rate: 1 Hz
    inputs = request(audio_part(base64.b64encode(lying).decode()))
    with pytest.raises(InvalidRequest, match="sample rate must be between 1000 and 384000"):
        parse_request(inputs)


def test_audio_longer_than_the_duration_limit_is_413() -> None:
    inputs = request(audio_part(base64.b64encode(wav_bytes(tone(seconds=2.0))).decode()))
    with pytest.raises(PayloadTooLarge, match="the limit is 1 s") as caught:
        parse_request(inputs, max_audio_seconds=1.0)
    assert caught.value.field == "messages[0].content[1].input_audio.data"
    assert parse_request(inputs, max_audio_seconds=2.5).messages[0].audio()[0].samples.size == 2 * RATE


def test_a_local_image_path_is_refused_unless_the_caller_allows_it(tmp_path: Path) -> None:
    path = tmp_path / "pixel.png"
    path.write_bytes(PNG_1PX)
    messages = []
    for url in (str(path), str(tmp_path / "missing.png")):
        with pytest.raises(InvalidRequest) as caught:
            parse_request(request({"type": "image_url", "image_url": {"url": url}}))
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and str(tmp_path) not in messages[0]
    assert as_chat_request(request({"type": "image_url", "image_url": {"url": str(path)}})).messages[0].parts[1].path == str(path)

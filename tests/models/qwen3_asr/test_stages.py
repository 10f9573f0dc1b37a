"""The Qwen3-ASR stages against transformers on the same tiny checkpoint, in one process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import ChatRequest, RecognitionOptions, parse_request
from omnictl.models.qwen3_asr import stages
from omnictl.models.qwen3_asr.decoder import AsrDelta
from omnictl.models.qwen3_asr.transcript import words_so_far
from omnictl.outputs import FinishReason, TokenResult, Transcript
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind

from .chain import InProcessAsr
from .conftest import Reference, clip, request

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def chain(tiny_asr: Path) -> InProcessAsr:
    return InProcessAsr(str(tiny_asr))


def run(chain: InProcessAsr, inputs: Any) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with chain:
            return await chain.run(inputs)

    return asyncio.run(go())


@pytest.mark.parametrize(("language", "prompt"), [(None, None), ("en", None), ("fr", "a meeting about trains")])
def test_preprocessing_gives_what_transformers_processor_gives(
    chain: InProcessAsr, reference: Reference, language: str | None, prompt: str | None
) -> None:
    audio = clip(2)
    extra = {} if prompt is None else {"recognition": RecognitionOptions(prompt=prompt)}
    ours = chain.pre(typed(request(audio, language=language), **extra))
    theirs = reference.inputs(audio, language=language, prompt=prompt)
    assert ours["input_ids"].tolist() == theirs["input_ids"][0].tolist()
    torch.testing.assert_close(ours["input_features"], theirs["input_features"], rtol=0, atol=0)
    assert torch.equal(ours["input_features_mask"], theirs["input_features_mask"])
    assert ours["language"] == language and ours["duration"] == pytest.approx(1.5)


def typed(inputs: dict[str, Any], **changes: Any) -> ChatRequest:
    """The request as the HTTP server hands it over, with ``changes`` (its recognition options)."""
    return msgspec.structs.replace(parse_request(inputs), **changes)


@pytest.mark.parametrize(("seed", "language"), [(1, None), (3, None), (1, "en")])
def test_greedy_tokens_and_text_equal_transformers_generate(
    chain: InProcessAsr, reference: Reference, seed: int, language: str | None
) -> None:
    audio = clip(seed)
    out = run(chain, request(audio, max_tokens=MAX_TOKENS, language=language))
    ids, parsed = reference.generate(audio, max_tokens=MAX_TOKENS, language=language)
    decoded = out["decoder"]
    assert isinstance(decoded, TokenResult)
    assert list(decoded.token_ids) == ids
    heard = out["transcript"]
    assert isinstance(heard, Transcript)
    assert heard.text == parsed["transcription"]
    assert heard.language == (language or None)
    assert heard.duration == pytest.approx(1.5)
    # not streamed: one segment spanning the clip, with every generated token
    assert [(s.start, s.end, s.text, s.tokens) for s in heard.segments] == [(0.0, 1.5, heard.text, ids)]
    # streamed as decoded, less a character whose bytes had not all come when it ended
    streamed = "".join(chunk.text for chunk in out["stream"])
    assert streamed and heard.text.startswith(streamed.strip())
    assert len(heard.text) - len(streamed.strip()) <= 2


def test_different_clips_get_different_answers(chain: InProcessAsr) -> None:
    # Guards the comparison above: a decoder that ignored the audio would pass it for one clip.
    answers = {run(chain, request(clip(seed), max_tokens=MAX_TOKENS))["transcript"].text for seed in (1, 2, 3)}
    assert len(answers) == 3


def test_a_streamed_request_answers_with_its_pieces_as_segments(chain: InProcessAsr, reference: Reference) -> None:
    audio = clip(1)
    out = run(chain, typed(request(audio, max_tokens=MAX_TOKENS), recognition=RecognitionOptions(stream=True)))
    heard = out["transcript"]
    pieces = [chunk.segments[0] for chunk in out["stream"]]
    assert [s.id for s in pieces] == list(range(len(pieces))) and len(pieces) > 1
    assert [s.text for s in heard.segments] == [s.text for s in pieces]
    assert "".join(s.text for s in heard.segments).strip() == heard.text
    assert [t for s in heard.segments for t in s.tokens] == reference.generate(audio, max_tokens=MAX_TOKENS)[0]


@pytest.mark.parametrize(
    ("text", "forced", "words"),
    [
        ("", False, None),
        ("lang", False, None),
        ("language Eng", False, None),
        ("language English<asr_text>", False, ""),
        ("language English<asr_text> Hello the", False, "Hello the"),
        ("Hello", False, "Hello"),
        ("langue", False, "langue"),
        ("language", True, "language"),
    ],
)
def test_the_language_header_is_held_back_until_the_words_start(text: str, forced: bool, words: str | None) -> None:
    assert words_so_far(text, forced) == words


def test_the_terminal_reads_a_detected_language_and_streams_only_the_words(tiny_asr: Path) -> None:
    terminal = stages.transcript(str(tiny_asr))
    tokenizer = terminal.processor.tokenizer
    ids = tokenizer.encode("language French<asr_text>Paris is the capital of France.", add_special_tokens=False)
    facts = {"duration": 2.0, "language": None, "stream": False}

    async def go() -> list[Any]:
        terminal.stage_name = "transcript"
        await terminal.start()
        try:
            for i, token in enumerate(ids):
                chunk = AsrDelta(text="", token_ids=[token], request=facts if i == 0 else None)
                await terminal.inbox.put(IncomingMessage(IncomingKind.STREAM_CHUNK, "r", chunk, "decoder"))
            result = TokenResult(text="", token_ids=ids, finish_reason=FinishReason.STOP)
            await terminal.inbox.put(IncomingMessage(IncomingKind.NEW_REQUEST, "r", result, "decoder"))
            out = []
            while not out or out[-1].kind is not OutgoingKind.RESULT:
                out.append(await asyncio.wait_for(terminal.outbox.get(), 10))
            return out
        finally:
            await terminal.stop()

    out = asyncio.run(go())
    streamed = "".join(m.data.text for m in out[:-1])
    assert streamed == "Paris is the capital of France."
    heard = out[-1].data
    assert (heard.text, heard.language, heard.duration) == ("Paris is the capital of France.", "fr", 2.0)
    assert terminal.load().running == 0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"recognition": RecognitionOptions(task="translate")}, "task"),
        ({"recognition": RecognitionOptions(words=True, timestamps=True)}, "timestamp_granularities[]"),
        ({"recognition": RecognitionOptions(temperature=0.5)}, "temperature"),
        ({"language": "xx"}, "language"),
    ],
)
def test_what_qwen3_asr_cannot_do_is_refused_by_name(chain: InProcessAsr, change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        chain.pre(typed(request(clip(1)), **change))
    assert refused.value.field == field


def test_a_request_without_exactly_one_clip_is_refused(chain: InProcessAsr) -> None:
    two = request(clip(1))
    two["messages"][0]["content"].append(two["messages"][0]["content"][0])
    text_only = {"messages": [{"role": "user", "content": "hello"}]}
    for inputs in (two, text_only):
        with pytest.raises(InvalidRequest, match="exactly one audio part") as refused:
            chain.pre(inputs)
        assert refused.value.field == "messages"


def test_a_missing_or_foreign_checkpoint_is_named(tmp_path: Path) -> None:
    from omnictl.exceptions import ModelPathError

    with pytest.raises(ModelPathError, match="no config.json"):
        stages.preprocessing(str(tmp_path))
    with pytest.raises(ModelPathError, match="local checkpoint directory"):
        stages.transcript(None)

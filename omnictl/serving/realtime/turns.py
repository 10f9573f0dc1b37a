"""The conversation one realtime session keeps, and the chat request each response is made from.

Every item is kept as text once it can be: what the user typed, what speech recognition
heard the user say (its transcript), what the assistant answered. A spoken item whose
transcript is not known (the topology has no ``transcript`` terminal, or recognition
is still running) goes to the pipeline as audio; once transcribed, its audio is let go
(the transcript is what every later response hears). The conversation is bounded: past
``max_items`` items or ``max_tokens`` (estimated, :func:`estimated_tokens`) the oldest
items are dropped, as OpenAI's server drops old turns: a conversation that outgrew the
model's context once failed every response from then on, with no way out.

A spoken answer remembers which words each piece of its audio said (``segments``), so it
can be cut to what the listener heard (:meth:`Turn.truncate`): the next response is then
built from those words only, not from an answer the user never heard to the end.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from omnictl.inputs import PCM16_RATE, AudioPart, ChatMessage, ChatRequest, SamplingParams, TextPart
from omnictl.serving.realtime.events import Content, Item, new_id

MAX_ITEMS = 64
MAX_TOKENS = 6_000  # below SmolLM2's 8,192-token context, leaving room for instructions and the answer
CHARS_PER_TOKEN = 4  # a tokenizer-free estimate, close for English BPE vocabularies
AUDIO_TOKENS_PER_S = 25  # what an omni model's audio encoder makes of a second (Qwen-Omni: 25)
TOKENS_PER_ITEM = 4  # the chat template's role markers


def estimated_tokens(turn: Turn) -> int:
    if turn.text is None and turn.audio is not None:
        return TOKENS_PER_ITEM + int(turn.audio.size / PCM16_RATE * AUDIO_TOKENS_PER_S)
    return TOKENS_PER_ITEM + len(turn.text or "") // CHARS_PER_TOKEN


@dataclass
class Turn:
    """One conversation item."""

    id: str
    role: str  # user | assistant | system
    text: str | None = None  # typed text, a transcript, or the assistant's answer
    audio: np.ndarray | None = None  # float32 mono at 24 kHz: a spoken user item
    transcribed: asyncio.Event = field(default_factory=asyncio.Event)  # set once text is final
    complete: bool = True  # False while the assistant is still answering
    spoken: bool = False  # an assistant answer given as audio (its text is the transcript)
    heard: bool = False  # a spoken user item (its audio may be gone: released once transcribed)
    incomplete: bool = False  # an answer cancelled before it was done
    segments: list[Segment] = field(default_factory=list)  # a spoken answer's audio, piece by piece
    truncated_ms: int | None = None  # where the audio was cut to what was played
    deleted: bool = False  # the client deleted it: nothing more is said of it (a transcript that comes late)

    @property
    def audio_ms(self) -> float:
        """Milliseconds of audio sent for this (assistant) item."""
        return self.segments[-1].end_ms if self.segments else 0.0

    def spoken_text(self) -> str:
        """The words of every audio piece sent."""
        return " ".join(s.words for s in self.segments if s.words)

    def truncate(self, audio_end_ms: int) -> None:
        """Cut a spoken answer to its first ``audio_end_ms``: its text becomes the words that
        audio said. Within a piece, words are placed by their share of its characters (the
        TTS gives no word timings): a word counts as heard once its end was played."""
        heard: list[str] = []
        for segment in self.segments:
            if segment.end_ms <= audio_end_ms:
                heard.append(segment.words)
                continue
            if segment.start_ms < audio_end_ms and segment.words:
                played = (audio_end_ms - segment.start_ms) / (segment.end_ms - segment.start_ms)
                words, total, seen = segment.words.split(), len(segment.words.replace(" ", "")), 0
                for word in words:
                    seen += len(word)
                    if seen / total > played:
                        break
                    heard.append(word)
            break
        self.text = " ".join(w for w in heard if w)
        self.truncated_ms = audio_end_ms

    def release_audio(self) -> None:
        """Let the audio go once the transcript stands for it."""
        if self.audio is not None and self.text is not None:
            self.audio, self.heard = None, True

    def item(self) -> Item:
        if self.role == "assistant" and self.spoken:
            content = [Content(type="output_audio", transcript=self.text or "")]
        elif self.role == "assistant":
            content = [Content(type="output_text", text=self.text or "")]
        elif self.audio is not None or self.heard:
            content = [Content(type="input_audio", transcript=self.text)]
        else:
            content = [Content(type="input_text", text=self.text or "")]
        return Item(
            id=self.id,
            role=self.role,  # type: ignore[arg-type]  # user, assistant or system: what this turn was made with
            content=content,
            status="in_progress" if not self.complete else "incomplete" if self.incomplete else "completed",
        )


@dataclass(frozen=True)
class Segment:
    """One piece of a spoken answer's audio: where it lies in the item's audio, and what it says."""

    start_ms: float
    end_ms: float
    words: str


@dataclass
class Conversation:
    max_items: int = MAX_ITEMS
    max_tokens: int = MAX_TOKENS
    turns: list[Turn] = field(default_factory=list)

    def last_id(self) -> str | None:
        return self.turns[-1].id if self.turns else None

    def find(self, item_id: str) -> Turn | None:
        return next((turn for turn in self.turns if turn.id == item_id), None)

    def delete(self, turn: Turn) -> None:
        self.turns.remove(turn)
        turn.deleted = True

    def add(self, turn: Turn) -> Turn:
        self.turns.append(turn)
        self.trim()
        return turn

    def trim(self) -> None:
        """Drop the oldest items past ``max_items`` or ``max_tokens`` (the newest always stays)."""
        del self.turns[: max(0, len(self.turns) - self.max_items)]
        tokens = sum(estimated_tokens(turn) for turn in self.turns)
        while len(self.turns) > 1 and tokens > self.max_tokens:
            tokens -= estimated_tokens(self.turns.pop(0))

    def audio_bytes(self) -> int:
        """Bytes of audio the conversation holds (spoken items not transcribed yet, or never)."""
        return sum(turn.audio.nbytes for turn in self.turns if turn.audio is not None)

    def user_audio(self, samples: np.ndarray, item_id: str | None = None) -> Turn:
        return self.add(Turn(id=item_id or new_id("item"), role="user", audio=samples, heard=True))

    def text(self, role: str, text: str, item_id: str | None = None) -> Turn:
        turn = Turn(id=item_id or new_id("item"), role=role, text=text)
        turn.transcribed.set()
        return self.add(turn)

    async def transcripts(self, turns: Sequence[Turn] | None = None) -> None:
        """Wait for every spoken item still being transcribed (of ``turns``, when given)."""
        for turn in list(self.turns if turns is None else turns):
            await turn.transcribed.wait()

    def request(
        self,
        instructions: str,
        sampling: SamplingParams,
        voice: str | None,
        turns: Sequence[Turn] | None = None,
        *,
        speed: float = 1.0,
    ) -> ChatRequest:
        """The whole conversation as one chat request: instructions first, then every item
        (``turns`` instead, when given: a preemptive answer's, the conversation as it was at
        the pause and the tentative turn, which is not in it yet)."""
        messages = [ChatMessage(role="system", parts=(TextPart(text=instructions),))] if instructions else []
        for turn in self.turns if turns is None else turns:
            if turn.text is None and turn.audio is not None:
                part: TextPart | AudioPart = AudioPart(
                    samples=turn.audio, sample_rate=PCM16_RATE, field=f"item {turn.id}"
                )
            else:
                part = TextPart(text=turn.text or "")
            messages.append(ChatMessage(role=turn.role, parts=(part,)))
        return ChatRequest(messages=tuple(messages), sampling=sampling, voice=voice, speed=speed)

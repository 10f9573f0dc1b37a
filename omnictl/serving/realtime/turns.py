"""The conversation one realtime session keeps, and the chat request each response is made from.

Every item is kept as text once it can be: what the user typed, what speech recognition
heard the user say (its transcript), what the assistant answered. A spoken item whose
transcript is not known (the topology has no ``transcript`` terminal, or recognition
is still running) goes to the pipeline as audio. The conversation is bounded: past
``max_items`` the oldest items are dropped, as a model's context would drop them anyway.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from omnictl.inputs import PCM16_RATE, AudioPart, ChatMessage, ChatRequest, SamplingParams, TextPart
from omnictl.serving.realtime.events import Content, Item, new_id

MAX_ITEMS = 64


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

    def item(self) -> Item:
        if self.role == "assistant" and self.spoken:
            content = [Content(type="output_audio", transcript=self.text or "")]
        elif self.role == "assistant":
            content = [Content(type="output_text", text=self.text or "")]
        elif self.audio is not None:
            content = [Content(type="input_audio", transcript=self.text)]
        else:
            content = [Content(type="input_text", text=self.text or "")]
        return Item(id=self.id, role=self.role, content=content,  # type: ignore[arg-type]
                    status="completed" if self.complete else "in_progress")


@dataclass
class Conversation:
    max_items: int = MAX_ITEMS
    turns: list[Turn] = field(default_factory=list)

    def last_id(self) -> str | None:
        return self.turns[-1].id if self.turns else None

    def add(self, turn: Turn) -> Turn:
        self.turns.append(turn)
        del self.turns[: max(0, len(self.turns) - self.max_items)]
        return turn

    def user_audio(self, samples: np.ndarray, item_id: str | None = None) -> Turn:
        return self.add(Turn(id=item_id or new_id("item"), role="user", audio=samples))

    def text(self, role: str, text: str, item_id: str | None = None) -> Turn:
        turn = Turn(id=item_id or new_id("item"), role=role, text=text)
        turn.transcribed.set()
        return self.add(turn)

    async def transcripts(self) -> None:
        """Wait for every spoken item still being transcribed."""
        for turn in list(self.turns):
            await turn.transcribed.wait()

    def request(self, instructions: str, sampling: SamplingParams, voice: str | None) -> ChatRequest:
        """The whole conversation as one chat request: instructions first, then every item."""
        messages = [ChatMessage(role="system", parts=(TextPart(text=instructions),))] if instructions else []
        for turn in self.turns:
            if turn.text is None and turn.audio is not None:
                part: TextPart | AudioPart = AudioPart(samples=turn.audio, sample_rate=PCM16_RATE, field=f"item {turn.id}")
            else:
                part = TextPart(text=turn.text or "")
            messages.append(ChatMessage(role=turn.role, parts=(part,)))
        return ChatRequest(messages=tuple(messages), sampling=sampling, voice=voice)

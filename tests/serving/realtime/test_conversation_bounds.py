"""A realtime conversation is bounded by tokens, not only by items (issue 24, bug 11), and a
spoken item lets its audio go once transcribed (bug 5)."""

from __future__ import annotations

import numpy as np

from omnictl.inputs import SamplingParams
from omnictl.serving.realtime.turns import Conversation, estimated_tokens


def test_past_the_token_budget_the_oldest_items_are_dropped() -> None:
    """64 items of 1,000 characters (~16,000 tokens) once outgrew SmolLM2's 8,192-token
    context: every response failed from then on."""
    conversation = Conversation()
    for i in range(64):
        conversation.text("user" if i % 2 else "assistant", f"{i:04d}" + "x" * 996)
    tokens = sum(estimated_tokens(turn) for turn in conversation.turns)
    assert tokens <= 6_000 < 8_192
    assert conversation.turns[-1].text.startswith("0063")  # the newest stays, the oldest went
    assert not any(turn.text.startswith("0000") for turn in conversation.turns)
    request = conversation.request("be brief", SamplingParams(), None)
    assert len(request.messages) == len(conversation.turns) + 1


def test_a_single_item_over_the_budget_still_stays_alone() -> None:
    conversation = Conversation(max_tokens=100)
    conversation.text("user", "short")
    conversation.text("user", "y" * 10_000)
    assert [len(t.text or "") for t in conversation.turns] == [10_000]


def test_transcribed_audio_is_released_and_the_item_stays_spoken() -> None:
    conversation = Conversation()
    turn = conversation.user_audio(np.zeros(24_000 * 120, np.float32))  # 120 s: 11.5 MB of float32
    assert conversation.audio_bytes() == 24_000 * 120 * 4
    turn.text = "what is the capital of France"
    turn.release_audio()
    assert turn.audio is None and conversation.audio_bytes() == 0
    assert turn.item().content[0].type == "input_audio" and turn.item().content[0].transcript == turn.text


class _Pipeline:
    """What a session asks of the pipeline before any response: its topology. (A test double:
    these items never reach the pipeline.)"""

    def __init__(self) -> None:
        from omnictl.topology import load
        from tests.serving.harness import FAST_TOPOLOGY

        self.topology = load(FAST_TOPOLOGY)


def test_audio_past_the_sessions_memory_bound_is_refused_with_an_error() -> None:
    """Bug 5: nothing bounded what one session holds. Items of audio the conversation must
    keep (no transcript terminal) are refused past ``max_realtime_session_bytes``."""
    import asyncio
    import base64

    import pytest

    from omnictl.serving.chat.protocol import Limits
    from omnictl.serving.realtime import events as ev
    from omnictl.serving.realtime.session import RealtimeSession
    from omnictl.serving.state import ServingState

    limits = Limits(max_realtime_session_bytes=4 * 2**20, max_realtime_conversation_tokens=10**9)
    sent: list[ev.ServerEvent] = []
    session = RealtimeSession(ServingState("fast", limits=limits), _Pipeline(), sent.append, "fast",  # type: ignore[arg-type]
                              silero=lambda: None)  # type: ignore[arg-type,return-value]
    one_second = base64.b64encode(bytes(24_000 * 2)).decode()  # 96 KB once held as float32
    item = ev.ConversationItemCreate(item=ev.Item(content=[ev.Content(type="input_audio", audio=one_second)]))

    async def add(count: int) -> None:
        for _ in range(count):
            await session.item_create(item)

    session.settings.vad = None
    asyncio.run(add(43))  # 43 x 96 KB: just under 4 MiB
    with pytest.raises(ev.EventError) as refused:
        asyncio.run(add(1))
    assert refused.value.code == "session_memory_limit" and "4 MiB" in refused.value.message
    assert session.held_bytes() <= limits.max_realtime_session_bytes

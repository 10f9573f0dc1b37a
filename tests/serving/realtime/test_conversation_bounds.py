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

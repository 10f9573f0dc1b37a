"""A thinker that stops at once (its first token is end-of-turn) streams nothing: the talker
gets its result alone, first, and answers with no speech rather than failing the request."""

from __future__ import annotations

import asyncio
from pathlib import Path

from omnictl.models.qwen3_omni import stages
from omnictl.models.qwen3_omni.payloads import TalkerResult, ThinkerResult
from omnictl.models.qwen3_omni.thinker import ThinkerRunner
from omnictl.outputs import FinishReason
from omnictl.schedulers.base import IncomingKind, IncomingMessage
from tests.schedulers.harness import Outcome, pump

from .test_thinker import thinker_inputs


def test_a_thinker_that_said_nothing_gets_an_answer_without_speech(tiny_qwen: Path) -> None:
    thinker = ThinkerRunner(str(tiny_qwen), "cpu")
    thinker.prefill("r", thinker_inputs(tiny_qwen, "text", "Hello"))
    # what the thinker sends when its first token is a stop token: no stream, and its
    # result, carrying the talker's prefix (it streamed none), as the talker's first message
    said_nothing = ThinkerResult(talker_prefix=thinker.take_talker_prefix("r"), token_ids=[], text="",
                                 prompt_tokens=9, completion_tokens=1, finish_reason=FinishReason.STOP)
    thinker.release("r")

    async def talk() -> Outcome:
        talker = stages.talker_ar(str(tiny_qwen), "cpu", max_codes=8)
        talker.stage_name = "talker_ar"
        await talker.start()
        outcomes: dict[str, Outcome] = {}
        try:
            params = {"sampling": {"max_tokens": 4}}
            talker.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "r", said_nothing, "thinker", params))
            talker.inbox.put_nowait(IncomingMessage(IncomingKind.STREAM_DONE, "r", None, "thinker", params))
            await pump(talker, outcomes, lambda: "r" in outcomes and outcomes["r"].done)
            return outcomes["r"]
        finally:
            await talker.stop()

    outcome = asyncio.run(talk())
    # it was refused before: "stage talker_ar: expected a dict as input, got ThinkerResult"
    assert outcome.error is None, outcome.error
    assert isinstance(outcome.result, TalkerResult)
    assert outcome.result.codes.shape == (0, 4) and outcome.chunks == []  # nothing to speak, no frame

"""The text terminal ``decode`` passes the thinker's logprobs on to the client: a request
that asked for them (the vLLM thinker honours them) must not lose them here."""

from __future__ import annotations

import asyncio
from pathlib import Path

from omnictl.models.qwen3_omni import stages
from omnictl.outputs import TextResult, TokenLogprob, TokenResult
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind


def test_the_result_keeps_the_thinkers_logprobs(tiny_qwen: Path) -> None:
    logprobs = [TokenLogprob(token="a", logprob=-0.5), TokenLogprob(token="b", logprob=-1.0)]

    async def scenario() -> list[TextResult]:
        scheduler = stages.decode(str(tiny_qwen))
        await scheduler.start()
        try:
            for rid, given in (("asked", logprobs), ("plain", None)):
                result = TokenResult(text="", token_ids=[10, 11], completion_tokens=2, logprobs=given)
                scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, rid, result, "thinker", {}))
            results = []
            while len(results) < 2:
                message = await asyncio.wait_for(scheduler.outbox.get(), 10)
                if message.kind is OutgoingKind.RESULT:
                    results.append(message.data)
            return results
        finally:
            await scheduler.stop()

    asked, plain = asyncio.run(scenario())
    assert asked.logprobs == logprobs and plain.logprobs is None

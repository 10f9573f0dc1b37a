"""The vLLM stage honours every sampling field of the one sampling type (issue 40 bug 7,
issue 41): penalties, min_p, logit_bias reach vLLM's SamplingParams; logprobs come back in
the result, one per answer token, in OpenAI's shape. No engine is started: the stand-in
and the real byte-level tokenizer of tests/schedulers/test_vllm_engine_unit.py. The real
engine on the real model: tests/models/voice_assistant/test_vllm_thinker.py (slow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs the vllm extra (pip install -e '.[vllm]'; scripts/setup.sh installs it)")

from vllm import CompletionOutput, RequestOutput  # noqa: E402
from vllm.logprobs import Logprob  # noqa: E402

from omnictl.models.tiny_causal_lm import EOS_ID  # noqa: E402
from omnictl.outputs import TokenLogprob, TopLogprob  # noqa: E402
from tests.schedulers.test_vllm_engine_unit import (  # noqa: E402, F401  (fixtures, found by name)
    Run,
    ScriptedEngine,
    checkpoint,
    checkpoints,
    drive,
    engine,
    ids,
)


def scored(rid: str, tokens: list[int], ranked: list[dict[int, tuple[float, int]]], *, finished: bool) -> RequestOutput:
    """A DELTA output whose positions carry vLLM's ``{token id: Logprob}``."""
    logprobs = [{token: Logprob(logprob=lp, rank=rank) for token, (lp, rank) in position.items()} for position in ranked]
    completion = CompletionOutput(index=0, text="", token_ids=tokens, cumulative_logprob=None, logprobs=logprobs,
                                  finish_reason="stop" if finished else None)
    return RequestOutput(request_id=rid, prompt=None, prompt_token_ids=None, prompt_logprobs=None,
                         outputs=[completion], finished=finished)


def test_every_field_reaches_vllms_sampling_params(engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        finished = scored("r1", ids("x"), [{ids("x")[0]: (-0.1, 1)}], finished=True)
        await run.answer("r1", {"prompt": "hello"}, finished, frequency_penalty=0.5, presence_penalty=-1.5,
                         repetition_penalty=1.2, min_p=0.05, logit_bias={str(ids("y")[0]): -100}, logprobs=True,
                         top_logprobs=3)
        _, sampling = engine.asked["r1"]
        assert (sampling.frequency_penalty, sampling.presence_penalty, sampling.repetition_penalty) == (0.5, -1.5, 1.2)
        assert sampling.min_p == 0.05 and sampling.logit_bias == {ids("y")[0]: -100.0} and sampling.logprobs == 3
        plain = scored("r2", ids("x"), [{}], finished=True)
        await run.answer("r2", {"prompt": "hello"}, plain)  # nothing asked: vLLM's neutral values
        _, sampling = engine.asked["r2"]
        assert (sampling.frequency_penalty, sampling.presence_penalty, sampling.repetition_penalty) == (0.0, 0.0, 1.0)
        assert sampling.min_p == 0.0 and sampling.logit_bias is None and sampling.logprobs is None
        assert run.result("r2").logprobs is None

    drive(engine, checkpoint, body)


def test_logprobs_come_back_one_per_answer_token_with_the_top_alternatives(
        engine: ScriptedEngine, checkpoint: Path) -> None:
    h, i, j = ids("hij")

    async def body(run: Run) -> None:
        first = scored("r1", [h], [{h: (-0.25, 1), i: (-1.5, 2), j: (-3.0, 3)}], finished=False)
        # the second position's chosen token is not among the top 2: it is still reported
        last = scored("r1", [i, EOS_ID], [{h: (-0.5, 1), j: (-1.0, 2), i: (-2.0, 4)}, {EOS_ID: (-0.01, 1)}],
                      finished=True)
        result = await run.answer("r1", {"prompt": "hello"}, first, last, logprobs=True, top_logprobs=2)
        assert result.text == "hi" and result.completion_tokens == 3  # the end token counts, is not text
        assert result.logprobs == [
            TokenLogprob(token="h", logprob=-0.25, bytes=[104],
                         top_logprobs=[TopLogprob(token="h", logprob=-0.25, bytes=[104]),
                                       TopLogprob(token="i", logprob=-1.5, bytes=[105])]),
            TokenLogprob(token="i", logprob=-2.0, bytes=[105],
                         top_logprobs=[TopLogprob(token="h", logprob=-0.5, bytes=[104]),
                                       TopLogprob(token="j", logprob=-1.0, bytes=[106])]),
        ]
        only = scored("r2", [h], [{h: (-0.25, 1), i: (-1.5, 2)}], finished=True)
        alone = await run.answer("r2", {"prompt": "hello"}, only, logprobs=True)  # top_logprobs 0: the chosen only
        assert alone.logprobs == [TokenLogprob(token="h", logprob=-0.25, bytes=[104], top_logprobs=[])]

    drive(engine, checkpoint, body)


def test_a_logit_bias_outside_the_vocabulary_is_refused_before_the_engine(
        engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        run.submit("r1", {"prompt": "a"}, logit_bias={"100000": 5})
        await run.until(lambda: run.ended("r1"))
        error: Any = run.error("r1")
        assert error.field == "sampling.logit_bias" and "token id 100000 is not in this model's vocabulary" in error.error
        assert engine.asked == {}

    drive(engine, checkpoint, body)

"""The voice assistant's thinker on vLLM (a real engine, one for the whole module):
the same greedy text as the HF runner, streaming, aborts that leave nothing in the
engine, and a too-long prompt refused before the engine sees it."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

pytest.importorskip("vllm", reason="needs the vllm extra (pip install -e '.[vllm]'; scripts/setup.sh installs it)")

from benchmarks.eval.samples import QUESTIONS
from omnictl.data import data_path
from omnictl.models.voice_assistant import stages
from omnictl.models.voice_assistant.answer_runner import SpokenAnswerRunner
from omnictl.outputs import FinishReason, TokenDelta, TokenResult
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, OutgoingMessage, Scheduler
from omnictl.schedulers.vllm_engine import VllmScheduler
from tests.support.loop import LoopThread

# Engine start-up (~25 s eager, more on a loaded machine) is paid once, in the first test.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # vLLM engines on the real SmolLM2

MAX_MODEL_LEN = 512
ENGINE = {"max_model_len": MAX_MODEL_LEN, "kv_cache_gib": 1, "max_num_seqs": 64, "enforce_eager": True}


def shipped_thinker_args() -> dict[str, Any]:
    """The thinker's factory_args in the shipped voice-assistant topology."""
    topology = yaml.safe_load(Path(data_path("voice-assistant.yaml")).read_text())
    (thinker,) = [stage for stage in topology["stages"] if stage["name"] == "thinker"]
    args = dict(thinker.get("factory_args") or {})
    args.pop("engine", None)
    args.pop("vllm", None)
    return args


class Collector:
    """Takes a scheduler's outbox apart by request id (on the scheduler's loop)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.messages: dict[str, list[OutgoingMessage]] = defaultdict(list)
        self._changed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            message = await self.scheduler.outbox.get()
            self.messages[message.request_id].append(message)
            self._changed.set()

    async def wait(self, condition: Any, timeout: float = 300.0) -> None:
        async def poll() -> None:
            while not condition():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(poll(), timeout)

    def final(self, rid: str) -> OutgoingMessage | None:
        return next((m for m in self.messages[rid] if m.kind is not OutgoingKind.STREAM), None)

    async def answer(self, rid: str, timeout: float = 300.0) -> tuple[list[OutgoingMessage], OutgoingMessage]:
        await self.wait(lambda: self.final(rid) is not None, timeout)
        final = self.final(rid)
        assert final is not None
        return [m for m in self.messages[rid] if m.kind is OutgoingKind.STREAM], final

    def close(self) -> None:
        self._task.cancel()


def ask(scheduler: Scheduler, rid: str, question: str | None = None, *, messages: list[Any] | None = None,
        **sampling: Any) -> None:
    messages = messages or [{"role": "user", "content": question}]
    scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, rid, {"messages": messages},
                                               params={"sampling": sampling}))


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


def _started(loop: LoopThread, scheduler: Scheduler, timeout: float) -> Collector:
    scheduler.stage_name = "thinker"
    loop.run(scheduler.start(), timeout=timeout)

    async def collector() -> Collector:
        return Collector(scheduler)

    return loop.run(collector())


@pytest.fixture(scope="module")
def vllm_thinker(loop: LoopThread) -> Iterator[tuple[VllmScheduler, Collector]]:
    """The shipped thinker's settings on vLLM, without the sentence cap (tests set it)."""
    args = {**shipped_thinker_args(), "max_sentences": None}
    scheduler = stages.thinker(engine="vllm", vllm=ENGINE, **args)
    assert isinstance(scheduler, VllmScheduler)
    scheduler.exit_on_engine_death = False  # driven alone here, not in a stage process
    collector = _started(loop, scheduler, timeout=600)
    yield scheduler, collector
    collector.close()
    loop.run(scheduler.stop(), timeout=120)


@pytest.fixture(scope="module")
def hf_thinker(loop: LoopThread) -> Iterator[tuple[AutoregressiveScheduler, Collector]]:
    """The shipped thinker on the HF runner, the reference the vLLM answers are held to: loaded
    once for the two tests that compare (each sets the runner's sentence cap it needs), where
    each loaded its own."""
    scheduler = stages.thinker(engine="hf", **shipped_thinker_args())
    assert isinstance(scheduler, AutoregressiveScheduler) and isinstance(scheduler.runner, SpokenAnswerRunner)
    collector = _started(loop, scheduler, timeout=120)
    yield scheduler, collector
    collector.close()
    loop.run(scheduler.stop())


def hf_answers(loop: LoopThread, hf_thinker: tuple[AutoregressiveScheduler, Collector], tag: str,
               max_sentences: int | None) -> dict[str, TokenResult]:
    scheduler, collector = hf_thinker
    runner = scheduler.runner
    assert isinstance(runner, SpokenAnswerRunner)
    runner.max_sentences = max_sentences  # what factory_args.max_sentences sets; read at each decode step
    return answers(loop, scheduler, collector, f"hf-{tag}")


def vllm_answers(loop: LoopThread, scheduler: VllmScheduler, collector: Collector, tag: str) -> dict[str, TokenResult]:
    return answers(loop, scheduler, collector, tag)


def answers(loop: LoopThread, scheduler: Scheduler, collector: Collector, prefix: str) -> dict[str, TokenResult]:
    """Every sample question asked at once (the vLLM engine batches them), then each one's result."""
    for name, question in QUESTIONS.items():
        ask(scheduler, f"{prefix}-{name}", question)
    results = {}
    for name in QUESTIONS:
        _, final = loop.run(collector.answer(f"{prefix}-{name}"), timeout=600)
        assert final.kind is OutgoingKind.RESULT, final.error
        results[name] = final.data
    return results


def first_difference(scheduler: VllmScheduler, hf: list[int], vllm: list[int]) -> str:
    for index, (a, b) in enumerate(zip(hf, vllm)):
        if a != b:
            decode = scheduler.tokenizer.decode
            return f"token {index}: HF {a} {decode([a])!r}, vLLM {b} {decode([b])!r} (after {decode(hf[:index])!r})"
    return f"one is a prefix of the other: HF {len(hf)} tokens, vLLM {len(vllm)}"


def assert_same_answers(scheduler: VllmScheduler, hf: dict[str, TokenResult], vllm: dict[str, TokenResult]) -> None:
    problems = []
    for name in QUESTIONS:
        if hf[name].token_ids != vllm[name].token_ids:
            problems.append(f"{name}: {first_difference(scheduler, hf[name].token_ids, vllm[name].token_ids)}")
        elif hf[name].text != vllm[name].text:
            problems.append(f"{name}: same tokens, different text: {hf[name].text!r} vs {vllm[name].text!r}")
    assert not problems, "greedy answers differ:\n" + "\n".join(problems)


def test_greedy_answers_equal_the_hf_runners_for_the_sample_questions(
    loop: LoopThread, vllm_thinker: tuple[VllmScheduler, Collector], hf_thinker: tuple[AutoregressiveScheduler, Collector]
) -> None:
    scheduler, collector = vllm_thinker
    vllm = vllm_answers(loop, scheduler, collector, "plain")
    hf = hf_answers(loop, hf_thinker, "plain", max_sentences=None)
    assert_same_answers(scheduler, hf, vllm)
    assert sum(len(r.token_ids) for r in vllm.values()) > 5 * 8  # real answers, not empty ones
    assert all(r.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) for r in vllm.values())
    assert {name: r.prompt_tokens for name, r in vllm.items()} == {name: r.prompt_tokens for name, r in hf.items()}


def test_with_the_shipped_sentence_cap_the_answers_still_equal_the_hf_runners(
    loop: LoopThread, vllm_thinker: tuple[VllmScheduler, Collector], hf_thinker: tuple[AutoregressiveScheduler, Collector]
) -> None:
    scheduler, collector = vllm_thinker
    cap = shipped_thinker_args()["max_sentences"]
    assert cap == 1
    scheduler.stop_when = stages.sentence_cap(cap)
    try:
        vllm = vllm_answers(loop, scheduler, collector, "capped")
    finally:
        scheduler.stop_when = None
    hf = hf_answers(loop, hf_thinker, "capped", max_sentences=cap)
    assert_same_answers(scheduler, hf, vllm)
    assert "Paris" in vllm["capital_of_france"].text


def test_deltas_arrive_in_order_before_the_result_and_add_up_to_it(
    loop: LoopThread, vllm_thinker: tuple[VllmScheduler, Collector]
) -> None:
    scheduler, collector = vllm_thinker
    ask(scheduler, "stream", "Tell me about the moon.", max_tokens=40)
    streamed, final = loop.run(collector.answer("stream"), timeout=300)
    assert final.kind is OutgoingKind.RESULT, final.error
    result = final.data
    assert isinstance(result, TokenResult) and all(isinstance(m.data, TokenDelta) for m in streamed)
    assert collector.messages["stream"][-1] is final  # every delta came before the result
    assert len(streamed) >= 10  # one per token (stream_every 1), not one lump
    assert "".join(m.data.text for m in streamed) == result.text
    assert [t for m in streamed for t in m.data.token_ids] == result.token_ids
    assert result.completion_tokens == 40 and result.finish_reason is FinishReason.LENGTH


def test_a_stop_string_ends_the_answer_and_is_never_streamed(
    loop: LoopThread, vllm_thinker: tuple[VllmScheduler, Collector]
) -> None:
    scheduler, collector = vllm_thinker
    ask(scheduler, "free", "What is the capital of France?", max_tokens=32)
    _, free = loop.run(collector.answer("free"), timeout=300)
    assert " Paris" in free.data.text
    ask(scheduler, "stopped", "What is the capital of France?", max_tokens=32, stop=[" Paris"])
    streamed, final = loop.run(collector.answer("stopped"), timeout=300)
    assert final.data.text == free.data.text.split(" Paris")[0]
    assert "".join(m.data.text for m in streamed) == final.data.text
    assert final.data.finish_reason is FinishReason.STOP
    assert loop.run(_engine_is_empty(scheduler, collector, "after-stop"))


def test_logprobs_logit_bias_and_penalties_act_on_the_real_engine(
    loop: LoopThread, vllm_thinker: tuple[VllmScheduler, Collector]
) -> None:
    """Issue 40 bug 7: the fields were accepted and did nothing. Greedy, so each effect is
    certain: logprobs are the engine's (the chosen token is the most likely one), a bias of
    -100 on the first answer token makes the engine choose another, a strong repetition
    penalty changes a repetitive answer."""
    scheduler, collector = vllm_thinker
    # request ids of this test's own ("lp-"): the module's collector keeps every answer, and
    # an id another test used ("free") would hand back that test's answer at once
    question = "Say the word hello five times."
    ask(scheduler, "lp-free", question, max_tokens=12)
    _, free = loop.run(collector.answer("lp-free"), timeout=300)
    assert free.kind is OutgoingKind.RESULT, free.error
    ask(scheduler, "lp-scored", question, max_tokens=12, logprobs=True, top_logprobs=3)
    _, scored = loop.run(collector.answer("lp-scored"), timeout=300)
    result = scored.data
    assert result.token_ids == free.data.token_ids and result.logprobs is not None
    assert len(result.logprobs) == len(result.token_ids)
    for token_id, entry in zip(result.token_ids, result.logprobs):
        assert entry.token == scheduler.tokenizer.decode([token_id]) and entry.logprob <= 0.0
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-4)
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
    first = free.data.token_ids[0]
    ask(scheduler, "lp-biased", question, max_tokens=12, logit_bias={str(first): -100})
    _, biased = loop.run(collector.answer("lp-biased"), timeout=300)
    assert biased.data.token_ids[0] != first
    ask(scheduler, "lp-penalised", question, max_tokens=12, repetition_penalty=2.0, frequency_penalty=2.0)
    _, penalised = loop.run(collector.answer("lp-penalised"), timeout=300)
    assert penalised.kind is OutgoingKind.RESULT, penalised.error
    assert penalised.data.token_ids != free.data.token_ids
    ask(scheduler, "lp-outside", question, logit_bias={str(len(scheduler.tokenizer)): 1})
    _, outside = loop.run(collector.answer("lp-outside"), timeout=300)
    assert outside.kind is OutgoingKind.ERROR and outside.field == "sampling.logit_bias"


async def _engine_is_empty(scheduler: VllmScheduler, collector: Collector, probe: str) -> bool:
    """True when the engine holds no request: a short probe runs alone in it (the
    engine's scheduler then reports at most the probe running and nothing waiting: a
    leaked request would still be running, its max_tokens far off) and afterwards no KV
    block is held by anyone (the prefix cache can be reset)."""
    engine = scheduler.engine
    assert engine is not None
    for _ in range(200):  # aborts reach the engine core asynchronously
        if engine.get_num_unfinished_requests() == 0:
            break
        await asyncio.sleep(0.05)
    updates = scheduler.counts.updates
    ask(scheduler, probe, "Hi", max_tokens=4)
    await collector.wait(lambda: collector.final(probe) is not None)
    running, waiting = scheduler.engine_counts()
    assert scheduler.counts.updates > updates, "the engine reported no figures while the probe ran"
    assert running <= 1 and waiting == 0, f"engine reports {running} running, {waiting} waiting beside the probe"
    return engine.get_num_unfinished_requests() == 0 and bool(await engine.reset_prefix_cache())


def test_fifty_aborts_while_generating_leave_nothing_in_the_engine_or_the_stage(
    loop: LoopThread, vllm_thinker: tuple[VllmScheduler, Collector]
) -> None:
    scheduler, collector = vllm_thinker
    ids = [f"abort-{i}" for i in range(50)]
    for i, rid in enumerate(ids):
        ask(scheduler, rid, f"Write a long story about the number {i}.", max_tokens=400)
    # All generating: each has streamed a token, none has finished.
    loop.run(collector.wait(lambda: all(collector.messages[rid] for rid in ids)), timeout=600)
    assert not any(collector.final(rid) for rid in ids)
    for rid in ids:
        scheduler.abort(rid)
    assert scheduler.load().running == 0 and scheduler.load().kv_slots == 0
    assert loop.run(_engine_is_empty(scheduler, collector, "after-aborts"), timeout=300)
    assert not any(collector.final(rid) for rid in ids)  # an aborted request sends no result
    assert not scheduler._tasks


def test_a_prompt_longer_than_max_model_len_is_refused_naming_the_limit_before_the_engine(
    loop: LoopThread, vllm_thinker: tuple[VllmScheduler, Collector]
) -> None:
    scheduler, collector = vllm_thinker
    engine = scheduler.engine
    assert engine is not None
    ask(scheduler, "long", "word " * 600)
    _, final = loop.run(collector.answer("long"), timeout=60)
    assert final.kind is OutgoingKind.ERROR
    assert final.field == "messages"  # the Stage turns this into a 400
    assert f"max_model_len is {MAX_MODEL_LEN}" in (final.error or "") and "stage thinker" in (final.error or "")
    assert engine.get_num_unfinished_requests() == 0 and not scheduler._tasks
    # One token under the limit is served (the answer gets the room that is left).
    ids = scheduler.prompt_ids({"messages": [{"role": "user", "content": "word " * 600}]})
    fits = {"input_ids": list(range(100, 100 + MAX_MODEL_LEN - 1))}
    scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "fits", fits, params={"sampling": {"max_tokens": 8}}))
    _, final = loop.run(collector.answer("fits"), timeout=300)
    assert len(ids) > MAX_MODEL_LEN
    assert final.kind is OutgoingKind.RESULT, final.error
    assert final.data.completion_tokens == 1  # max_model_len - prompt: one token of room

"""The vLLM stage's own logic, each test well under a second, with no engine started: how
a request's input becomes prompt ids, how the request is asked of the engine (vLLM's
SamplingParams), how the engine's token deltas become omnictl's stream chunks and one
result (stop tokens, stop strings, max_tokens, ``stop_when``, held-back text, streaming
every n tokens), aborts, failures of one request and of the whole engine, the profile
records from the engine's timestamps, the engine's counts, and start and stop.

The one stand-in is vLLM's ``AsyncLLM`` (:class:`ScriptedEngine`): its ``generate`` yields,
for each request, the outputs a test scripted, built from vLLM's own ``RequestOutput`` /
``CompletionOutput`` / ``RequestStateStats``; it records what it was asked and whether the
scheduler closed the stream before its end (how vLLM's own ``generate`` aborts a request in
the engine). The tokenizer is real (a byte-level one saved as a checkpoint folder). The real
engine on a real model is tests/models/voice_assistant/test_vllm_thinker.py (slow)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import types
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

pytest.importorskip("vllm", reason="needs the vllm extra (pip install -e '.[vllm]'; scripts/setup.sh installs it)")

import torch
from tokenizers.processors import TemplateProcessing
from vllm import CompletionOutput, RequestOutput
from vllm import SamplingParams as EngineSampling
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import RequestStateStats, SchedulerStats

from omnictl.exceptions import InvalidRequest
from omnictl.models.tiny_causal_lm import EOS, EOS_ID, tiny_tokenizer
from omnictl.outputs import FinishReason, TokenDelta, TokenResult
from omnictl.profiling.events import EventKind
from omnictl.schedulers import vllm_engine
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, OutgoingMessage, SchedulerLoad
from omnictl.schedulers.vllm_engine import (
    VllmOptions,
    VllmScheduler,
    _counting_logger,
    _Counts,
    cpu_binding,
    require_vllm,
    vllm_installed,
)
from tests.schedulers.harness import RecordingProfiler

# The byte-level tokenizer: one token per printable character, id = code point - 32.
TILDE = ord("~") - 32  # an end token of the generation config besides <eos>
HASH = ord("#") - 32  # an extra stop token the stage factory adds
PAD = EOS_ID + 1  # a special token that is no end token: never in the text
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def ids(text: str) -> list[int]:
    return [ord(c) - 32 for c in text]


def write_checkpoint(folder: Path, generation_eos: Any) -> Path:
    """A checkpoint folder with only what the scheduler reads: the tokenizer (a chat template,
    and ``<eos>`` appended when special tokens are asked for) and the generation config."""
    tokenizer = tiny_tokenizer()
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, EOS_ID)])
    tokenizer.chat_template = TEMPLATE
    tokenizer.add_special_tokens({"pad_token": "<pad>"})
    assert tokenizer.pad_token_id == PAD
    tokenizer.save_pretrained(folder)
    if generation_eos is not None:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vllm-unit")
    return {
        "list": write_checkpoint(root / "list", [EOS_ID, TILDE]),
        "int": write_checkpoint(root / "int", TILDE),
        "none": write_checkpoint(root / "none", None),
    }


@pytest.fixture()
def checkpoint(checkpoints: dict[str, Path]) -> Path:
    return checkpoints["list"]


# --- the stand-in for vLLM's AsyncLLM ------------------------------------------------------


def out(rid: str, tokens: list[int], *, finished: bool = False, reason: str | None = None,
        metrics: Any = None) -> RequestOutput:
    """One DELTA output of the engine: the tokens new since the last one."""
    completion = CompletionOutput(index=0, text="", token_ids=tokens, cumulative_logprob=None, logprobs=None,
                                  finish_reason=reason)
    return RequestOutput(request_id=rid, prompt=None, prompt_token_ids=None, prompt_logprobs=None,
                         outputs=[completion], finished=finished, metrics=metrics)


class ScriptedEngine:
    """Test double for ``AsyncLLM``: each request's stream is its script, item by item: a
    RequestOutput is yielded, an exception raised, an asyncio.Event waited for (the engine
    still working). ``ended[rid]``: how the stream ended: ``"exhausted"`` (the script ran
    out, or was closed after its last output), ``"closed"`` (closed by the scheduler while
    the script had more: vLLM then aborts the request in the engine), ``"cancelled"`` (the
    request's task cancelled: an abort) or ``"raised"``."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Any]] = {}
        self.asked: dict[str, tuple[Any, EngineSampling]] = {}
        self.ended: dict[str, str] = {}
        self.errored = False
        self.shutdowns = 0
        self.built_with: tuple[Any, Any] | None = None

    def script(self, rid: str, *items: Any) -> None:
        self.scripts[rid] = list(items)

    def generate(self, prompt: Any, sampling: EngineSampling, request_id: str) -> AsyncIterator[RequestOutput]:
        self.asked[request_id] = (prompt, sampling)
        return self._stream(request_id, self.scripts.pop(request_id))

    async def _stream(self, rid: str, items: list[Any]) -> AsyncIterator[RequestOutput]:
        left = len(items)  # items not taken yet
        try:
            for item in items:
                left -= 1
                if isinstance(item, BaseException):
                    self.ended[rid] = "raised"
                    raise item
                if isinstance(item, asyncio.Event):
                    await item.wait()
                    continue
                yield item
            self.ended[rid] = "exhausted"
        except GeneratorExit:
            self.ended[rid] = "closed" if left else "exhausted"
            raise
        except asyncio.CancelledError:
            self.ended[rid] = "cancelled"
            raise

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture()
def engine(monkeypatch: pytest.MonkeyPatch) -> ScriptedEngine:
    engine = ScriptedEngine()

    def from_engine_args(engine_args: Any, stat_loggers: Any = None) -> ScriptedEngine:
        engine.built_with = (engine_args, stat_loggers)
        return engine

    monkeypatch.setattr(AsyncLLM, "from_engine_args", staticmethod(from_engine_args))
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.setenv(name, "placeholder")  # so that what start() sets is undone after the test
        monkeypatch.delenv(name)
    return engine


class Hooked(VllmScheduler):
    """The scheduler with its model hooks recorded (what a model's stage subclass overrides)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accepted: list[tuple[str, Any, list[int]]] = []
        self.dropped: list[str] = []
        self.finals: list[tuple[str, bool]] = []
        self.wrap = False  # on_output wraps what it is given (to see that its return value leaves)

    def on_accept(self, request_id: str, inputs: Any, prompt_ids: list[int]) -> None:
        self.accepted.append((request_id, inputs, prompt_ids))

    def on_output(self, request_id: str, data: TokenDelta | TokenResult, *, final: bool) -> Any:
        self.finals.append((request_id, final))
        return ("wrapped", data) if self.wrap else data

    def on_drop(self, request_id: str) -> None:
        self.dropped.append(request_id)


class Run:
    """A started scheduler, what it emitted, and ways to wait for it."""

    def __init__(self, scheduler: VllmScheduler, engine: ScriptedEngine) -> None:
        self.scheduler = scheduler
        self.engine = engine
        self.messages: list[OutgoingMessage] = []

    def submit(self, rid: str, data: Any, kind: IncomingKind = IncomingKind.NEW_REQUEST, **sampling: Any) -> None:
        self.scheduler.inbox.put_nowait(IncomingMessage(kind, rid, data, params={"sampling": sampling}))

    def _drain(self) -> None:
        while not self.scheduler.outbox.empty():
            self.messages.append(self.scheduler.outbox.get_nowait())

    async def until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._drain()
        while not condition():
            if loop.time() > deadline:
                raise AssertionError(f"condition not met; emitted so far: {self.messages}")
            await asyncio.sleep(0.001)
            self._drain()

    async def settle(self) -> None:
        """Let every ready task run (a few loop turns) and collect what they emitted."""
        for _ in range(20):
            await asyncio.sleep(0)
        self._drain()

    def of(self, rid: str, kind: OutgoingKind | None = None) -> list[OutgoingMessage]:
        return [m for m in self.messages if m.request_id == rid and (kind is None or m.kind is kind)]

    def ended(self, rid: str) -> bool:
        return any(m.kind is not OutgoingKind.STREAM for m in self.of(rid))

    def result(self, rid: str) -> TokenResult:
        (message,) = self.of(rid, OutgoingKind.RESULT)
        assert isinstance(message.data, TokenResult)
        return message.data

    def chunks(self, rid: str) -> list[TokenDelta]:
        return [m.data for m in self.of(rid, OutgoingKind.STREAM)]

    def error(self, rid: str) -> OutgoingMessage:
        (message,) = self.of(rid, OutgoingKind.ERROR)
        return message

    async def answer(self, rid: str, data: Any, *items: Any, **sampling: Any) -> TokenResult:
        self.engine.script(rid, *items)
        self.submit(rid, data, **sampling)
        await self.until(lambda: self.ended(rid))
        return self.result(rid)


def drive(engine: ScriptedEngine, checkpoint: Path, body: Callable[[Run], Awaitable[Any]], *,
          cls: type[VllmScheduler] = VllmScheduler, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
          **kwargs: Any) -> Any:
    kwargs.setdefault("exit_on_engine_death", False)
    kwargs.setdefault("options", VllmOptions(max_model_len=64))

    async def scenario() -> Any:
        scheduler = cls(str(checkpoint), **kwargs)
        scheduler.stage_name = "thinker"
        scheduler.profiler = RecordingProfiler()
        await scheduler.start()
        try:
            return await body(Run(scheduler, engine))
        finally:
            await scheduler.stop()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(asyncio.wait_for(scenario(), 10))


def events(scheduler: VllmScheduler, rid: str) -> list[tuple[EventKind, dict[str, Any]]]:
    profiler = scheduler.profiler
    assert isinstance(profiler, RecordingProfiler)
    return [(kind, meta) for kind, request, meta in profiler.events if request == rid]


# --- the module's helpers --------------------------------------------------------------------


def test_vllm_installed_reads_the_import_system_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    require_vllm()  # installed: no error
    assert vllm_installed()  # imported here already
    monkeypatch.delitem(sys.modules, "vllm")
    assert vllm_installed()  # found on the path, not imported
    assert "vllm" not in sys.modules
    monkeypatch.setattr(vllm_engine.importlib.util, "find_spec", lambda name: None)
    assert not vllm_installed()
    monkeypatch.setitem(sys.modules, "vllm", None)  # imports of it blocked
    assert not vllm_installed()


def cores_of_this_process(*cores: int) -> Callable[[int], set[int]]:
    """A stand-in for ``os.sched_getaffinity`` that answers for this process (pid 0) only."""

    def affinity(pid: int) -> set[int]:
        assert pid == 0, f"asked for the cores of process {pid!r}, not of this one"
        return set(cores)

    return affinity


def test_cpu_binding_splits_this_process_cores_into_contiguous_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", cores_of_this_process(7, 2, 3, 4, 5, 6))
    assert cpu_binding(1) == "2,3,4,5,6,7"
    assert cpu_binding(2) == "2,3,4|5,6,7"
    assert cpu_binding(4) == "2|3|4|5"  # an equal share each; the rest unused
    assert cpu_binding(6) == "2|3|4|5|6|7"
    with pytest.raises(ValueError, match="^tensor_parallel_size 7 needs a core per rank; this process may use 6$"):
        cpu_binding(7)


def test_engine_args_carry_every_knob_and_the_model_factory_arguments() -> None:
    options = VllmOptions(kv_cache_gib=2, max_num_seqs=8, max_model_len=512, enforce_eager=False, dtype="bfloat16",
                          prefix_caching=False, tensor_parallel_size=2)
    args = options.engine_args("/models/m", max_logprobs=3)
    assert isinstance(args, AsyncEngineArgs)
    assert (args.model, args.tokenizer, args.dtype, args.max_model_len, args.max_num_seqs) == (
        "/models/m", "/models/m", "bfloat16", 512, 8)
    assert (args.enforce_eager, args.enable_prefix_caching, args.tensor_parallel_size) == (False, False, 2)
    assert (args.disable_log_stats, args.seed, args.max_logprobs) == (False, 0, 3)
    assert args.kv_cache_memory_bytes is None  # on a CPU the cache size goes by VLLM_CPU_KVCACHE_SPACE
    gpu = VllmOptions(kv_cache_gib=3, device="cuda").engine_args("/models/m")
    assert gpu.kv_cache_memory_bytes == 3 * 2**30
    assert (gpu.enforce_eager, gpu.enable_prefix_caching, gpu.tensor_parallel_size) == (True, True, 1)
    # the block size: vLLM's own default unless given (prefix caching reuses whole blocks)
    assert args.block_size is None and VllmOptions(block_size=32).engine_args("/models/m").block_size == 32


def test_the_counting_logger_keeps_the_engine_scheduler_figures() -> None:
    counts = _Counts()
    logger_cls = _counting_logger(counts)
    assert issubclass(logger_cls, StatLoggerBase)
    logger = logger_cls(object(), engine_index=1)
    logger.log_engine_initialized()
    logger.record(None, None)  # an iteration without scheduler figures changes nothing
    assert counts == _Counts()
    logger.record(SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, num_skipped_waiting_reqs=4,
                                 kv_cache_usage=0.25), None)
    assert (counts.running, counts.waiting, counts.kv_usage, counts.updates) == (3, 6, 0.25, 1)
    logger.record(SchedulerStats(num_running_reqs=1), None, engine_idx=0)
    assert (counts.running, counts.waiting, counts.kv_usage, counts.updates) == (1, 0, 0.0, 2)


# --- construction, start and stop ---------------------------------------------------------


def test_stop_ids_are_the_tokenizer_s_the_generation_config_s_and_the_extra_ones(
        checkpoints: dict[str, Path]) -> None:
    def stop_ids(name: str, extra: tuple[int, ...] = ()) -> set[int]:
        return VllmScheduler(str(checkpoints[name]), extra_stop_token_ids=extra)._stop_ids

    assert stop_ids("list") == {EOS_ID, TILDE}
    assert stop_ids("int") == {EOS_ID, TILDE}
    assert stop_ids("none") == {EOS_ID}  # no generation config: the tokenizer's end token
    assert stop_ids("none", (HASH,)) == {EOS_ID, HASH}


def test_bad_construction_arguments_are_refused(checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="^stream_every must be >= 1, got 0$"):
        VllmScheduler(str(checkpoint), stream_every=0)
    with pytest.raises(InvalidRequest, match=r"^default_sampling.top_p: must be in \(0, 1\], got 2.0$"):
        VllmScheduler(str(checkpoint), default_sampling={"top_p": 2.0})
    with pytest.raises(ValueError, match="^factory_args.vllm.max_num_seqs: must be an integer >= 1, got 0$"):
        VllmScheduler(str(checkpoint), VllmOptions(max_num_seqs=0))
    scheduler = VllmScheduler(Path(checkpoint), stream_every=1)  # the smallest interval
    assert scheduler.model == str(checkpoint) and scheduler.options == VllmOptions()
    assert scheduler.exit_on_engine_death and scheduler.engine is None


def test_start_builds_the_engine_from_the_options_with_the_counting_logger(
        engine: ScriptedEngine, checkpoint: Path) -> None:
    logging.getLogger("vllm.v1.metrics.loggers").setLevel(logging.INFO)

    async def body(run: Run) -> None:
        assert run.scheduler.engine is engine
        assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2"
        assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ  # one rank: vLLM's own binding
        assert logging.getLogger("vllm.v1.metrics.loggers").level == logging.WARNING
        assert engine.built_with is not None
        args, loggers = engine.built_with
        assert (args.model, args.max_model_len, args.max_logprobs) == (str(checkpoint), 64, 4)
        (logger_cls,) = loggers
        logger_cls(None).record(SchedulerStats(num_running_reqs=2, num_waiting_reqs=5), None)
        assert run.scheduler.engine_counts() == (2, 5)
        assert run.scheduler.counts.updates == 1

    drive(engine, checkpoint, body, options=VllmOptions(max_model_len=64, kv_cache_gib=2),
          model_args={"max_logprobs": 4})


def test_start_binds_tensor_parallel_cpu_ranks_unless_the_binding_is_given(
        engine: ScriptedEngine, checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", cores_of_this_process(0, 1, 2, 3))

    async def body(run: Run) -> None:
        pass

    drive(engine, checkpoint, body, options=VllmOptions(tensor_parallel_size=2))
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "5|6")
    drive(engine, checkpoint, body, options=VllmOptions(tensor_parallel_size=2))
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "5|6"


def test_on_a_gpu_start_sets_no_cpu_environment(engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ
        assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
        assert engine.built_with is not None and engine.built_with[0].kv_cache_memory_bytes == 2**30

    drive(engine, checkpoint, body, options=VllmOptions(device="cuda", tensor_parallel_size=2))


def test_stop_cancels_what_is_held_and_shuts_the_engine_down_once(engine: ScriptedEngine, checkpoint: Path) -> None:
    held = asyncio.Event()

    async def body(run: Run) -> None:
        engine.script("r1", out("r1", ids("a")), held)
        run.submit("r1", {"prompt": "hi"})
        await run.until(lambda: engine.ended == {} and len(run.chunks("r1")) == 1)
        await run.scheduler.stop()
        assert engine.ended == {"r1": "cancelled"} and engine.shutdowns == 1
        assert run.scheduler.engine is None

    drive(engine, checkpoint, body)  # drive stops it a second time: nothing more happens
    assert engine.shutdowns == 1


# --- the prompt -----------------------------------------------------------------------------


def test_prompt_ids_from_input_ids_text_or_chat_messages(checkpoint: Path) -> None:
    scheduler = VllmScheduler(str(checkpoint), system_prompt="Be brief.")
    assert scheduler.prompt_ids({"input_ids": [1, 2, 3]}) == [1, 2, 3]
    from_tensor = scheduler.prompt_ids({"input_ids": torch.tensor([[4, 5], [6, 7]])})
    assert from_tensor == [4, 5, 6, 7] and all(type(i) is int for i in from_tensor)
    assert scheduler.prompt_ids({"prompt": "hi!"}) == ids("hi!")  # no <eos> added: special tokens off
    chat = scheduler.prompt_ids({"messages": [{"role": "user", "content": "hi"}]})
    assert scheduler.tokenizer.decode(chat) == "<system>Be brief.\n<user>hi\n<assistant>"
    own_system = [{"role": "system", "content": "Be long."}, {"role": "user", "content": "hi"}]
    assert scheduler.tokenizer.decode(scheduler.prompt_ids({"messages": own_system})) == (
        "<system>Be long.\n<user>hi\n<assistant>")
    plain = VllmScheduler(str(checkpoint))
    assert plain.tokenizer.decode(plain.prompt_ids({"messages": [{"role": "user", "content": "hi"}]})) == (
        "<user>hi\n<assistant>")


@pytest.mark.parametrize(
    ("inputs", "message", "field"),
    [
        ([1, 2], "expected a dict as input, got list", "inputs"),
        ({"inputs_embeds": [[0.0]]}, "model input: this vLLM stage takes token ids, not inputs_embeds "
         "(use factory_args.engine: hf for an embeddings prompt)", "inputs_embeds"),
        ({"prompt": "a", "inputs_embeds": [[0.0]]}, "model input: this vLLM stage takes token ids", "inputs_embeds"),
        ({}, "model input: expected exactly one of input_ids, prompt, messages, got nothing", "inputs"),
        ({"prompt": "a", "input_ids": [1]},
         "model input: expected exactly one of input_ids, prompt, messages, got ['input_ids', 'prompt']", "inputs"),
        ({"prompt": 5}, "model input: prompt must be a string, got int", "prompt"),
        ({"prompt": ""}, "model input: prompt is empty", "prompt"),
        ({"input_ids": []}, "model input: input_ids is empty", "input_ids"),
        ({"messages": []}, "model input: messages must be a non-empty list", "messages"),
    ],
)
def test_a_bad_prompt_is_named(checkpoint: Path, inputs: Any, message: str, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        VllmScheduler(str(checkpoint)).prompt_ids(inputs)
    assert str(caught.value).startswith(message) and caught.value.field == field


def test_a_prompt_must_leave_room_for_an_answer(checkpoint: Path) -> None:
    scheduler = VllmScheduler(str(checkpoint), VllmOptions(max_model_len=16))
    scheduler._check_length(15)
    with pytest.raises(InvalidRequest) as caught:
        scheduler._check_length(16)
    assert str(caught.value) == ("the prompt is 16 tokens; this stage's max_model_len is 16 (prompt and answer "
                                 "together): shorten the messages")
    assert caught.value.field == "messages"


# --- asking the engine ------------------------------------------------------------------------


def test_the_engine_is_asked_for_deltas_of_token_ids_with_the_request_sampling(
        engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        await run.answer("r1", {"prompt": "hello"}, out("r1", ids("x"), finished=True, reason="stop"),
                         temperature=0.5, top_p=0.9, top_k=7, seed=11, max_tokens=20)
        prompt, sampling = engine.asked["r1"]
        assert prompt == {"prompt_token_ids": ids("hello")}
        assert (sampling.n, sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed) == (1, 0.5, 0.9, 7, 11)
        assert sampling.max_tokens == 20
        assert sampling.stop_token_ids == sorted({EOS_ID, TILDE, HASH})
        assert sampling.detokenize is False and sampling.output_kind is RequestOutputKind.DELTA
        # A long answer is capped to what the context has room for (64 - 60 tokens).
        await run.answer("r2", {"input_ids": list(range(1, 61))}, out("r2", ids("x"), finished=True))
        assert engine.asked["r2"][1].max_tokens == 4
        await run.answer("r3", {"input_ids": list(range(1, 61))}, out("r3", ids("x"), finished=True), max_tokens=3)
        assert engine.asked["r3"][1].max_tokens == 3
        # The stage's defaults, under the request's own fields.
        await run.answer("r4", {"prompt": "a"}, out("r4", ids("x"), finished=True), top_k=2)
        assert (engine.asked["r4"][1].temperature, engine.asked["r4"][1].top_k) == (0.7, 2)

    drive(engine, checkpoint, body, extra_stop_token_ids=(HASH,), default_sampling={"temperature": 0.7, "top_k": 9})


def test_bad_requests_fail_before_the_engine_sees_them(engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        run.submit("r1", {"prompt": "a"}, top_p=0.0)
        run.submit("r2", {"prompt": 3})
        run.submit("r3", {"input_ids": list(range(1, 17))})
        run.submit("r4", {"prompt": "a"}, kind=IncomingKind.STREAM_CHUNK)  # this stage takes no input stream
        run.submit("r4", {"prompt": "a"}, kind=IncomingKind.STREAM_DONE)
        await run.until(lambda: all(run.ended(rid) for rid in ("r1", "r2", "r3")))
        await run.settle()
        assert run.error("r1").error == "stage thinker: sampling.top_p: must be in (0, 1], got 0.0"
        assert run.error("r1").field == "sampling.top_p"
        assert run.error("r2").error == "stage thinker: model input: prompt must be a string, got int"
        assert run.error("r2").field == "prompt"
        assert run.error("r3").error.startswith("stage thinker: the prompt is 16 tokens; this stage's max_model_len")
        assert run.error("r3").field == "messages"
        assert run.of("r4") == [] and engine.asked == {}
        assert isinstance(run.scheduler, Hooked) and run.scheduler.accepted == []
        assert run.scheduler.load().running == 0

    drive(engine, checkpoint, body, cls=Hooked, options=VllmOptions(max_model_len=16))


def test_a_request_id_already_running_is_refused_and_the_first_goes_on(engine: ScriptedEngine, checkpoint: Path) -> None:
    gate = asyncio.Event()

    async def body(run: Run) -> None:
        engine.script("r1", out("r1", ids("ab")), gate, out("r1", ids("c"), finished=True, reason="stop"))
        run.submit("r1", {"prompt": "x"})
        await run.until(lambda: len(run.chunks("r1")) == 1)
        run.submit("r1", {"prompt": "y"})
        await run.until(lambda: run.ended("r1"))
        assert run.error("r1").error == "stage thinker: a request with this id is already running here"
        assert run.error("r1").field is None
        assert run.scheduler.load().running == 1  # the first one still runs
        gate.set()
        await run.until(lambda: len(run.of("r1", OutgoingKind.RESULT)) == 1)
        assert run.result("r1").text == "abc" and run.scheduler.load().running == 0

    drive(engine, checkpoint, body)


# --- turning the engine's tokens into chunks and a result ---------------------------------


def test_tokens_stream_as_chunks_and_end_in_one_result(engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        assert isinstance(run.scheduler, Hooked)
        run.scheduler.wrap = True
        messages = {"messages": [{"role": "user", "content": "hi"}]}
        engine.script("r1", out("r1", ids("He")), out("r1", []), out("r1", ids("llo")),
                      out("r1", ids("!"), finished=True, reason="stop"))
        run.submit("r1", messages)
        await run.until(lambda: run.ended("r1"))
        chunks = [m.data for m in run.of("r1", OutgoingKind.STREAM)]
        assert all(wrapped == "wrapped" for wrapped, _ in chunks)  # what on_output made of each
        assert [(c.text, c.token_ids) for _, c in chunks] == [("He", ids("He")), ("llo", ids("llo")), ("!", ids("!"))]
        (final,) = run.of("r1", OutgoingKind.RESULT)
        wrapped, result = final.data
        assert wrapped == "wrapped" and isinstance(result, TokenResult)
        prompt_tokens = len(run.scheduler.accepted[0][2])
        assert result == TokenResult(text="Hello!", finish_reason=FinishReason.STOP, prompt_tokens=prompt_tokens,
                                     completion_tokens=6, token_ids=ids("Hello!"))
        assert run.scheduler.finals == [("r1", False)] * 3 + [("r1", True)]
        assert run.scheduler.accepted == [("r1", messages, run.scheduler.prompt_ids(messages))]
        assert engine.ended["r1"] == "exhausted" and run.scheduler.dropped == []
        assert run.scheduler.load().running == 0 and run.scheduler.load().kv_slots == 0

    drive(engine, checkpoint, body, cls=Hooked)


def test_stream_every_n_tokens_and_the_rest_at_the_end(engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        result = await run.answer("r1", {"prompt": "x"}, *(out("r1", ids(c)) for c in "abcde"),
                                  out("r1", [], finished=True, reason="stop"))
        assert [c.text for c in run.chunks("r1")] == ["ab", "cd", "e"]
        assert result.text == "abcde" and result.completion_tokens == 5
        # Several tokens in one output count one by one.
        await run.answer("r2", {"prompt": "x"}, out("r2", ids("abc")), out("r2", ids("d")), out("r2", ids("e")),
                         out("r2", ids("f"), finished=True))
        assert [c.text for c in run.chunks("r2")] == ["abc", "de", "f"]

    drive(engine, checkpoint, body, stream_every=2)


def test_how_an_answer_ends_the_engine_s_length_or_stop(engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        length = await run.answer("r1", {"prompt": "x"}, out("r1", ids("ab"), finished=True, reason="length"))
        assert (length.finish_reason, length.text) == (FinishReason.LENGTH, "ab")
        stop = await run.answer("r2", {"prompt": "x"}, out("r2", ids("ab"), finished=True, reason="stop"))
        assert stop.finish_reason is FinishReason.STOP
        other = await run.answer("r3", {"prompt": "x"}, out("r3", ids("ab"), finished=True, reason="abort"))
        assert other.finish_reason is FinishReason.STOP
        # A stream that ends without a finished output: the answer as it stands, held-back text kept out.
        ran_out = await run.answer("r4", {"prompt": "x"}, out("r4", ids("abEN")), stop=["END"])
        assert (ran_out.finish_reason, ran_out.text, ran_out.token_ids) == (FinishReason.STOP, "ab", ids("abEN"))
        assert engine.ended == {"r1": "exhausted", "r2": "exhausted", "r3": "exhausted", "r4": "exhausted"}

    drive(engine, checkpoint, body)


def test_a_stop_token_ends_the_answer_without_appearing_and_aborts_the_rest(
        engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        result = await run.answer("r1", {"prompt": "x"}, out("r1", ids("ab")), out("r1", [*ids("c"), TILDE, *ids("d")]),
                                  out("r1", ids("never")))
        assert (result.text, result.token_ids, result.completion_tokens) == ("abc", ids("abc"), 4)
        assert result.finish_reason is FinishReason.STOP
        assert [c.token_ids for c in run.chunks("r1")] == [ids("ab"), ids("c")]
        assert engine.ended["r1"] == "closed"  # the engine is told at once
        extra = await run.answer("r2", {"prompt": "x"}, out("r2", [*ids("a"), HASH]))
        assert (extra.text, extra.completion_tokens, extra.finish_reason) == ("a", 2, FinishReason.STOP)
        # Any other special token is the model's to produce, and no text.
        padded = await run.answer("r3", {"prompt": "x"}, out("r3", [*ids("a"), PAD, *ids("b")], finished=True))
        assert (padded.text, padded.token_ids, padded.completion_tokens) == ("ab", [*ids("a"), PAD, *ids("b")], 3)

    drive(engine, checkpoint, body, extra_stop_token_ids=(HASH,))


def test_a_stop_string_is_cut_and_never_streamed(engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        result = await run.answer("r1", {"prompt": "x"}, out("r1", ids("abE")), out("r1", ids("N")),
                                  out("r1", ids("Dzz")), out("r1", ids("more")), stop=["END", "!!"])
        assert (result.text, result.finish_reason, result.completion_tokens) == ("ab", FinishReason.STOP, 5)
        assert result.token_ids == ids("abEND")
        # "E" and "EN" might have begun the stop string: held back, and then never sent.
        assert [(c.text, c.token_ids) for c in run.chunks("r1")] == [("ab", ids("abE")), ("", ids("N")),
                                                                      ("", ids("D"))]
        assert engine.ended["r1"] == "closed"
        # Held back, then released: it was not the stop string after all.
        held = await run.answer("r2", {"prompt": "x"}, out("r2", ids("aE")), out("r2", ids("Nx")),
                                out("r2", [], finished=True), stop=["END"])
        assert [c.text for c in run.chunks("r2")] == ["a", "ENx"] and held.text == "aENx"

    drive(engine, checkpoint, body)


def test_max_tokens_is_kept_here_too(engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        result = await run.answer("r1", {"prompt": "x"}, out("r1", ids("abcdef")), out("r1", ids("gh")), max_tokens=3)
        assert (result.text, result.finish_reason, result.completion_tokens) == ("abc", FinishReason.LENGTH, 3)
        assert engine.ended["r1"] == "closed"
        one = await run.answer("r2", {"prompt": "x"}, out("r2", ids("ab")), max_tokens=1)
        assert (one.text, one.finish_reason) == ("a", FinishReason.LENGTH)

    drive(engine, checkpoint, body)


def test_stop_when_ends_the_answer_where_it_says(engine: ScriptedEngine, checkpoint: Path) -> None:
    seen: list[str] = []

    def stop_when(text: str) -> bool:
        seen.append(text)
        return text.endswith(".")

    async def body(run: Run) -> None:
        result = await run.answer("r1", {"prompt": "x"}, out("r1", ids("Hi. And")), out("r1", ids("more")))
        assert (result.text, result.finish_reason, result.completion_tokens) == ("Hi.", FinishReason.STOP, 3)
        assert seen == ["H", "Hi", "Hi."] and engine.ended["r1"] == "closed"
        # max_tokens decides first on the same token
        seen.clear()
        capped = await run.answer("r2", {"prompt": "x"}, out("r2", ids("a.")), max_tokens=2)
        assert capped.finish_reason is FinishReason.LENGTH and seen == ["a"]

    drive(engine, checkpoint, body, stop_when=stop_when)


def test_the_sentence_cap_keeps_mr_darcys_whole_first_sentence(engine: ScriptedEngine, checkpoint: Path) -> None:
    from omnictl.models.voice_assistant.stages import sentence_cap

    async def body(run: Run) -> None:
        answer = out("r1", ids("Mr. Darcy is rich. He lives in Derbyshire."))
        result = await run.answer("r1", {"prompt": "x"}, answer)
        assert (result.text, result.finish_reason) == ("Mr. Darcy is rich.", FinishReason.STOP)

    drive(engine, checkpoint, body, stop_when=sentence_cap(1))


# --- aborts and failures -----------------------------------------------------------------------


def test_an_abort_cancels_the_request_in_the_engine_and_sends_nothing(engine: ScriptedEngine, checkpoint: Path) -> None:
    gate = asyncio.Event()

    async def body(run: Run) -> None:
        assert isinstance(run.scheduler, Hooked)
        engine.script("r1", out("r1", ids("ab")), gate, out("r1", ids("c"), finished=True))
        engine.script("r2", out("r2", ids("x")), gate, out("r2", ids("y"), finished=True))
        run.submit("r1", {"prompt": "x"})
        run.submit("r2", {"prompt": "x"})
        await run.until(lambda: len(run.chunks("r1")) == 1 and len(run.chunks("r2")) == 1)
        assert run.scheduler.load() == SchedulerLoad(queued=0, running=2, kv_slots=2)
        run.scheduler.abort("r1")
        assert run.scheduler.dropped == ["r1"] and run.scheduler.load().running == 1
        await run.settle()
        assert engine.ended == {"r1": "cancelled"}
        gate.set()
        await run.until(lambda: run.ended("r2"))
        await run.settle()
        assert [m.kind for m in run.of("r1")] == [OutgoingKind.STREAM]  # nothing after the abort
        assert run.result("r2").text == "xy" and run.scheduler.load().running == 0
        run.scheduler.abort("unknown")  # nothing held: only the hook hears of it
        assert run.scheduler.dropped == ["r1", "unknown"]
        assert not any(kind is EventKind.DECODE_STEPS for kind, _ in events(run.scheduler, "r1"))

    drive(engine, checkpoint, body, cls=Hooked)


def test_a_failed_generation_fails_that_request_only(engine: ScriptedEngine, checkpoint: Path) -> None:
    gate = asyncio.Event()

    async def body(run: Run) -> None:
        assert isinstance(run.scheduler, Hooked)
        boom = RuntimeError("bad logits")
        engine.script("r1", out("r1", ids("a")), boom)
        engine.script("r2", gate, out("r2", ids("ok"), finished=True))
        run.submit("r2", {"prompt": "x"})
        run.submit("r1", {"prompt": "x"})
        await run.until(lambda: run.ended("r1"))
        error = run.error("r1")
        assert error.error == "stage thinker: generation failed: RuntimeError: bad logits"
        assert error.exc is boom and error.field is None
        assert run.scheduler.dropped == ["r1"] and run.scheduler.load().running == 1
        gate.set()
        await run.until(lambda: run.ended("r2"))
        assert run.result("r2").text == "ok" and run.scheduler.load().running == 0
        engine.script("r3", out("r3", ids("z"), finished=True))
        run.submit("r3", {"prompt": "x"})  # the engine still takes requests
        await run.until(lambda: run.ended("r3"))
        assert run.result("r3").text == "z"

    drive(engine, checkpoint, body, cls=Hooked)


def test_a_dead_engine_fails_everything_held_once_and_refuses_new_work(
        engine: ScriptedEngine, checkpoint: Path, caplog: pytest.LogCaptureFixture) -> None:
    gate = asyncio.Event()

    async def body(run: Run) -> None:
        assert isinstance(run.scheduler, Hooked)
        engine.script("r1", out("r1", ids("a")), EngineDeadError("core gone"))
        engine.script("r2", out("r2", ids("b")), gate, EngineDeadError())
        engine.script("r3", gate, EngineDeadError())  # a dead engine fails every generate() call
        for rid in ("r2", "r3", "r1"):
            run.submit(rid, {"prompt": "x"})
        await run.until(lambda: all(run.ended(rid) for rid in ("r1", "r2", "r3")))
        reason = f"stage thinker: the vLLM engine died (EngineDeadError: {EngineDeadError('core gone')})"
        assert [run.error(rid).error for rid in ("r1", "r2", "r3")] == [reason] * 3
        assert sorted(run.scheduler.dropped) == ["r1", "r2", "r3"]
        assert run.scheduler.load().running == 0
        gate.set()
        await run.settle()
        assert engine.ended == {"r1": "raised", "r2": "raised", "r3": "raised"}
        assert [len(run.of(rid, OutgoingKind.ERROR)) for rid in ("r1", "r2", "r3")] == [1, 1, 1]
        run.submit("r4", {"prompt": "x"})
        await run.until(lambda: run.ended("r4"))
        assert run.error("r4").error == reason and "r4" not in engine.asked

    with caplog.at_level(logging.ERROR, logger="omnictl.schedulers.vllm_engine"):
        drive(engine, checkpoint, body, cls=Hooked)
    (record,) = [r for r in caplog.records if r.name == "omnictl.schedulers.vllm_engine"]
    assert record.getMessage() == (
        f"stage thinker: the vLLM engine died (EngineDeadError: {EngineDeadError('core gone')}); 3 request(s) failed")


def test_any_error_of_an_errored_engine_is_its_death(engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        engine.errored = True
        engine.script("r1", out("r1", ids("a")), ConnectionError("socket closed"))
        run.submit("r1", {"prompt": "x"})
        await run.until(lambda: run.ended("r1"))
        assert run.error("r1").error == "stage thinker: the vLLM engine died (ConnectionError: socket closed)"
        assert run.error("r1").exc is None
        run.submit("r2", {"prompt": "x"})
        await run.until(lambda: run.ended("r2"))
        assert run.error("r2").error == run.error("r1").error

    drive(engine, checkpoint, body)


class TimerLoop(asyncio.SelectorEventLoop):
    """An event loop that records the stage's SIGTERM to its own process instead of arming it."""

    def __init__(self) -> None:
        super().__init__()
        self.kills: list[tuple[float, tuple[Any, ...]]] = []

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any,
                   context: Any = None) -> asyncio.TimerHandle:
        if callback is os.kill:
            self.kills.append((delay, args))
            callback, args = (lambda: None), ()
        return super().call_later(delay, callback, *args, context=context)


def test_a_dead_engine_ends_the_stage_process_for_the_restart_policy(engine: ScriptedEngine, checkpoint: Path) -> None:
    loops: list[TimerLoop] = []

    def loop_factory() -> TimerLoop:
        loops.append(TimerLoop())
        return loops[-1]

    async def body(run: Run) -> None:
        engine.script("r1", EngineDeadError("core gone"))
        run.submit("r1", {"prompt": "x"})
        await run.until(lambda: run.ended("r1"))
        assert run.error("r1").error == (
            f"stage thinker: the vLLM engine died (EngineDeadError: {EngineDeadError('core gone')}); the stage "
            "process exits so the restart policy (--max-restarts) can start it again")
        assert loops[0].kills == [(1.0, (os.getpid(), signal.SIGTERM))]

    drive(engine, checkpoint, body, loop_factory=loop_factory, exit_on_engine_death=True)


# --- profiling from the engine's timestamps -------------------------------------------------


def test_profile_records_come_from_the_engine_timestamps(engine: ScriptedEngine, checkpoint: Path) -> None:
    first = RequestStateStats(queued_ts=10.0, scheduled_ts=10.1234567, first_token_ts=10.75)
    last = RequestStateStats(queued_ts=10.0, scheduled_ts=10.1234567, first_token_ts=10.75, last_token_ts=12.0000004)

    async def body(run: Run) -> None:
        await run.answer("r1", {"prompt": "hey"}, out("r1", [], metrics=first), out("r1", ids("ab")),
                         out("r1", ids("c"), finished=True, metrics=last))
        assert events(run.scheduler, "r1") == [
            (EventKind.PREFILL_START, {}),
            (EventKind.PREFILL_END, {"prompt_tokens": 3, "queue_s": 0.123457, "prefill_s": 0.626543}),
            (EventKind.FIRST_EMIT, {}),
            (EventKind.DECODE_STEPS, {"steps": 2, "seconds": 1.25}),  # to the microsecond
        ]
        # Clocks out of order read as zero, not as negative times.
        skewed = RequestStateStats(queued_ts=5.0, scheduled_ts=4.0, first_token_ts=3.0, last_token_ts=2.0)
        await run.answer("r2", {"prompt": "hey"}, out("r2", ids("a"), finished=True, metrics=skewed))
        assert events(run.scheduler, "r2")[1:] == [
            (EventKind.PREFILL_END, {"prompt_tokens": 3, "queue_s": 0.0, "prefill_s": 0.0}),
            (EventKind.FIRST_EMIT, {}),
            (EventKind.DECODE_STEPS, {"steps": 0, "seconds": 0.0}),
        ]
        # Not scheduled yet, or no metrics at all: the counts only.
        unscheduled = RequestStateStats(queued_ts=5.0, first_token_ts=6.0)
        await run.answer("r3", {"prompt": "hey"}, out("r3", ids("ab"), finished=True, metrics=unscheduled))
        assert events(run.scheduler, "r3")[1] == (EventKind.PREFILL_END, {"prompt_tokens": 3})
        assert events(run.scheduler, "r3")[3] == (EventKind.DECODE_STEPS, {"steps": 1, "seconds": 0.0})
        await run.answer("r4", {"prompt": "hey"}, out("r4", ids("ab"), finished=True))
        assert events(run.scheduler, "r4")[1] == (EventKind.PREFILL_END, {"prompt_tokens": 3})
        # Another vLLM's metrics that lack a timestamp read as "not set".
        partial = types.SimpleNamespace(queued_ts=1.0, scheduled_ts=1.5, first_token_ts=2.0)
        await run.answer("r5", {"prompt": "hey"}, out("r5", ids("ab"), finished=True, metrics=partial))
        assert events(run.scheduler, "r5")[1][1] == {"prompt_tokens": 3, "queue_s": 0.5, "prefill_s": 0.5}
        assert events(run.scheduler, "r5")[3] == (EventKind.DECODE_STEPS, {"steps": 1, "seconds": 0.0})

    drive(engine, checkpoint, body)


def test_the_first_emit_is_recorded_once_when_something_is_sent(engine: ScriptedEngine, checkpoint: Path) -> None:
    async def body(run: Run) -> None:
        # The first token could begin the stop string: sent as a token with no text yet.
        await run.answer("r1", {"prompt": "x"}, out("r1", ids("E")), out("r1", ids("a")), out("r1", ids("b")),
                         out("r1", [], finished=True), stop=["EN"])
        kinds = [kind for kind, _ in events(run.scheduler, "r1")]
        assert kinds.count(EventKind.FIRST_EMIT) == 1
        assert kinds.index(EventKind.FIRST_EMIT) == kinds.index(EventKind.PREFILL_END) + 1
        assert [(c.text, c.token_ids) for c in run.chunks("r1")] == [("", ids("E")), ("Ea", ids("a")), ("b", ids("b"))]

    drive(engine, checkpoint, body)

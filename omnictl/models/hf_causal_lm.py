"""An autoregressive runner for any transformers causal LM (Llama, Qwen2, SmolLM2, ...).

Each request owns its KV cache. Requests that decode together are stacked into one
batch cache, left-padded to the longest, with an attention mask that hides the padding
and position ids counted per request, so a request's tokens do not depend on what else
shares its batch. The batch cache is kept between steps and only rebuilt when the set
of decoding requests changes (a request joined, finished or was aborted).

Long prompts prefill in chunks (:meth:`HFCausalLMRunner.prefill_chunk`, driven by the
scheduler's ``prefill_chunk`` tokens per step): the request's KV cache is carried from
one chunk to the next, and between chunks the scheduler applies aborts and runs the
other requests' decode steps. Only plain prompts chunk (``input_ids`` or
``inputs_embeds`` with an attention mask); a subclass whose prompt carries more (position
ids, multimodal extras) prefills whole.

Subclasses adapt other prompt forms or position schemes (multimodal rope) by
overriding :meth:`prompt_inputs` and :meth:`decode_position_ids`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from omnictl.exceptions import InvalidRequest
from omnictl.models import tensor_parallel
from omnictl.models.kv_batch import KV, BatchCache, kv_layers
from omnictl.schedulers.chat import text_messages
from omnictl.schedulers.detokenizer import TextDecoder, WholeDecoder, stream_decoder_factory
from omnictl.schedulers.runner import StepOutput

if TYPE_CHECKING:
    from omnictl.schedulers.autoregressive import AutoregressiveScheduler

_PROMPT_KEYS = ("input_ids", "inputs_embeds", "prompt", "messages")
_CHUNKABLE = {"input_ids", "inputs_embeds", "attention_mask"}  # model inputs that slice by position


@dataclass(slots=True)
class _Sequence:
    length: int  # cached positions
    next_position: int  # position id of the next input token
    own_cache: KV | None  # set while the request is outside the batch cache


@dataclass(slots=True)
class _Prefill:
    """A prompt part-way through a chunked prefill."""

    model_inputs: dict[str, Any]  # from prompt_inputs, whole
    cache: DynamicCache  # the positions done so far
    done: int = 0

    @property
    def length(self) -> int:
        return int(self.model_inputs["attention_mask"].shape[-1])

    def part(self, end: int) -> dict[str, Any]:
        """Model inputs for positions ``done:end``, the mask covering the cache too."""
        key = "input_ids" if "input_ids" in self.model_inputs else "inputs_embeds"
        mask = self.model_inputs["attention_mask"][:, :end]
        return {key: self.model_inputs[key][:, self.done : end], "attention_mask": mask}


class HFCausalLMRunner:
    """Implements :class:`omnictl.schedulers.runner.AutoregressiveRunner` for a causal LM.

    ``inputs`` of :meth:`prefill` hold exactly one of ``input_ids`` (ints or a 1-D tensor),
    ``inputs_embeds`` (``[length, hidden]``), ``prompt`` (text, tokenized) or ``messages``
    (chat messages, rendered with the tokenizer's chat template). ``hidden_layer`` picks
    which layer's state :class:`StepOutput` carries (``None``: no hidden states).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Any = None,
        *,
        hidden_layer: int | None = None,
        extra_stop_token_ids: Sequence[int] = (),
    ) -> None:
        self.model = model
        model.eval()
        self.tokenizer = tokenizer
        self.hidden_layer = hidden_layer
        self.device = next(model.parameters()).device
        self._check_full_attention_cache()
        forward_params = inspect.signature(model.forward).parameters
        self._accepts_logits_to_keep = "logits_to_keep" in forward_params
        # transformers renamed `past_key_values` to `cache` (the old name warns until 5.40).
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        self._stop_ids = self._collect_stop_ids(extra_stop_token_ids)
        self._sequences: dict[str, _Sequence] = {}
        self._prefills: dict[str, _Prefill] = {}  # chunked prefills in progress
        self._batch: BatchCache | None = None

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32, **kwargs: Any
    ) -> HFCausalLMRunner:
        """Load a local checkpoint directory (nothing is downloaded); in a tensor-parallel
        group, this rank's shard of it."""
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, local_files_only=True, **tensor_parallel.load_kwargs(config)
        )
        model.to(device)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return cls(model, tokenizer, **kwargs)

    # --- the runner protocol ---------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, request_id: str, inputs: Mapping[str, Any]) -> StepOutput:
        """The whole prompt, or what a chunked prefill (:meth:`prefill_chunk`) left of it."""
        if request_id in self._sequences:
            raise ValueError(f"request {request_id!r} already holds a KV cache in this runner")
        pending = self._prefills.pop(request_id, None)
        if pending is None:
            model_inputs = self.prompt_inputs(inputs)
            cache, part = DynamicCache(), model_inputs
        else:
            model_inputs, cache = pending.model_inputs, pending.cache
            part = pending.part(pending.length) if pending.done else model_inputs
        prompt_length = int(model_inputs["attention_mask"].shape[-1])
        extra: dict[str, Any] = {"logits_to_keep": 1} if self._accepts_logits_to_keep else {}
        out = self.model(
            **part,
            **{self._cache_kwarg: cache},
            use_cache=True,
            output_hidden_states=self.hidden_layer is not None,
            **extra,
        )
        own_cache = kv_layers(cache)
        self._sequences[request_id] = _Sequence(prompt_length, self.first_decode_position(model_inputs), own_cache)
        return StepOutput(
            logits=out.logits[0, -1].float(),
            hidden=self._hidden_row(out, 0),
            prompt_tokens=prompt_length,
        )

    @torch.inference_mode()
    def prefill_chunk(
        self, request_id: str, inputs: Mapping[str, Any], max_tokens: int
    ) -> tuple[int, StepOutput | None]:
        """Prefill at most ``max_tokens`` more prompt positions: (positions done by this
        call, the first next-token scores once the prompt is complete, else None).

        The last part goes through :meth:`prefill`, so a subclass's ``prefill`` still
        sees every request finish its prompt there. A prompt that cannot be sliced by
        position prefills whole on the first call.
        """
        if max_tokens < 1:
            raise ValueError(f"prefill_chunk: max_tokens must be >= 1, got {max_tokens}")
        pending = self._prefills.get(request_id)
        if pending is None:
            if request_id in self._sequences:
                raise ValueError(f"request {request_id!r} already holds a KV cache in this runner")
            pending = self._prefills[request_id] = _Prefill(self.prompt_inputs(inputs), DynamicCache())
        remaining = pending.length - pending.done
        if remaining <= max_tokens or not set(pending.model_inputs) <= _CHUNKABLE:
            return remaining, self.prefill(request_id, inputs)
        end = pending.done + max_tokens
        extra: dict[str, Any] = {"logits_to_keep": 1} if self._accepts_logits_to_keep else {}
        self.model(**pending.part(end), **{self._cache_kwarg: pending.cache}, use_cache=True, **extra)
        pending.done = end
        return max_tokens, None

    @torch.inference_mode()
    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        if len(request_ids) != len(token_ids):
            raise ValueError(f"decode: {len(request_ids)} request ids but {len(token_ids)} tokens")
        unknown = [rid for rid in request_ids if rid not in self._sequences]
        if unknown:
            raise KeyError(f"decode: no KV cache for request(s) {unknown} (never prefilled, or released)")
        batch = self._batch_for(tuple(request_ids))
        attention_mask = batch.next_step_mask(self.device)
        sequences = [self._sequences[rid] for rid in request_ids]
        out = self.model(
            input_ids=torch.tensor(token_ids, dtype=torch.long, device=self.device)[:, None],
            attention_mask=attention_mask,
            position_ids=self.decode_position_ids(request_ids, sequences),
            **{self._cache_kwarg: batch.cache},
            use_cache=True,
            output_hidden_states=self.hidden_layer is not None,
        )
        for sequence in sequences:
            sequence.length += 1
            sequence.next_position += 1
        return [
            StepOutput(logits=out.logits[row, -1].float(), hidden=self._hidden_row(out, row))
            for row in range(len(request_ids))
        ]

    def release(self, request_id: str) -> None:
        self._prefills.pop(request_id, None)
        if self._sequences.pop(request_id, None) is None:
            return
        batch = self._batch
        if batch is not None and not any(rid in self._sequences for rid in batch.request_ids):
            self._batch = None  # nobody left in it: free the memory now, not at the next decode

    def stop_token_ids(self) -> set[int]:
        return set(self._stop_ids)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def text_decoder(self) -> TextDecoder:
        """The tokenizer's streaming decoder when it has one, else :meth:`detokenize` each step."""
        new_decoder = stream_decoder_factory(self.tokenizer)
        return new_decoder() if new_decoder is not None else WholeDecoder(self.detokenize)

    def kv_slots(self) -> int:
        return len(self._sequences) + len(self._prefills)

    # --- hooks for subclasses --------------------------------------------------------

    def prompt_inputs(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Model keyword arguments for the prompt (batch of one), with ``attention_mask``."""
        given = [key for key in _PROMPT_KEYS if key in inputs]
        if len(given) != 1:
            raise InvalidRequest(
                f"model input: expected exactly one of {', '.join(_PROMPT_KEYS)}, got {sorted(inputs) or 'nothing'}",
                field="inputs",
            )
        key = given[0]
        if key == "inputs_embeds":
            embeds = torch.as_tensor(inputs[key]).to(self.device, self.model.dtype)
            embeds = embeds[None] if embeds.dim() == 2 else embeds
            self._check_context(int(embeds.shape[1]), key)
            return {"inputs_embeds": embeds, "attention_mask": self._ones(embeds.shape[1])}
        if key == "input_ids":
            ids = torch.as_tensor(inputs[key], dtype=torch.long).reshape(1, -1).to(self.device)
        else:
            ids = self._tokenize(key, inputs[key])
        if ids.shape[1] == 0:
            raise InvalidRequest(f"model input: {key} is empty", field=key)
        self._check_context(int(ids.shape[1]), key)
        return {"input_ids": ids, "attention_mask": self._ones(ids.shape[1])}

    @property
    def context_length(self) -> int | None:
        """The most positions the model attends to (its config's ``max_position_embeddings``)."""
        limit = self.model.config.to_dict().get("max_position_embeddings")
        return int(limit) if isinstance(limit, int) and limit > 0 else None

    def _check_context(self, length: int, key: str) -> None:
        # Refused before the forward pass: a prompt past the model's context (a 100,000
        # character one was 16.7k tokens against 8,192) once kept the thinker in one
        # prefill for minutes, for everyone, and could not be aborted meanwhile.
        limit = self.context_length
        if limit is not None and length >= limit:
            raise InvalidRequest(
                f"the prompt is {length} tokens; this model's context length is {limit} "
                "(prompt and answer together): shorten the messages",
                field=key,
            )

    def first_decode_position(self, model_inputs: Mapping[str, torch.Tensor]) -> int:
        """Position id of the first generated token (the prompt's length for plain rope)."""
        return int(model_inputs["attention_mask"].shape[-1])

    def decode_position_ids(self, request_ids: Sequence[str], sequences: Sequence[_Sequence]) -> torch.Tensor:
        """Position ids ``[batch, 1]`` of this step's input tokens, counted per request."""
        return torch.tensor([[s.next_position] for s in sequences], dtype=torch.long, device=self.device)

    # --- internals -------------------------------------------------------------------

    def _batch_for(self, request_ids: tuple[str, ...]) -> BatchCache:
        batch = self._batch
        if batch is not None and batch.request_ids == request_ids:
            return batch
        # The set changed: take every live request's rows out of the old batch cache,
        # then stack the decoding ones again, left-padded to the longest.
        if batch is not None:
            for row, rid in enumerate(batch.request_ids):
                sequence = self._sequences.get(rid)
                if sequence is not None:
                    # A request sitting this batch out copies its rows: a view would keep the
                    # whole old batch cache alive until it rejoins.
                    sequence.own_cache = batch.rows(row, copy=rid not in request_ids)
        self._batch = BatchCache.stack(request_ids, [self._own(rid) for rid in request_ids])
        for rid in request_ids:
            self._sequences[rid].own_cache = None  # the batch cache holds it now
        return self._batch

    def _own(self, request_id: str) -> KV:
        cache = self._sequences[request_id].own_cache
        if cache is None:
            raise RuntimeError(f"request {request_id!r} has no KV rows outside the batch (internal error)")
        return cache

    def _hidden_row(self, out: Any, row: int) -> torch.Tensor | None:
        if self.hidden_layer is None:
            return None
        hidden: torch.Tensor = out.hidden_states[self.hidden_layer][row, -1]
        return hidden.float()

    def _ones(self, length: int) -> torch.Tensor:
        return torch.ones(1, length, dtype=torch.long, device=self.device)

    def _tokenize(self, key: str, value: Any) -> torch.Tensor:
        if self.tokenizer is None:
            raise InvalidRequest(f"model input: {key} needs a tokenizer, and this runner has none", field=key)
        if key == "prompt":
            if not isinstance(value, str):
                raise InvalidRequest(f"model input: prompt must be a string, got {type(value).__name__}", field=key)
            ids = self.tokenizer(value, add_special_tokens=False)["input_ids"]
        else:
            ids = self.tokenizer.apply_chat_template(
                text_messages(value), add_generation_prompt=True, tokenize=True, return_dict=False
            )
        return torch.tensor(list(ids), dtype=torch.long, device=self.device).reshape(1, -1)

    def _collect_stop_ids(self, extra: Sequence[int]) -> set[int]:
        stop: set[int] = set(int(i) for i in extra)
        for source in (self.model.generation_config.eos_token_id, self.tokenizer and self.tokenizer.eos_token_id):
            if isinstance(source, int):
                stop.add(source)
            elif isinstance(source, (list, tuple)):
                stop.update(int(i) for i in source)
        return stop

    def _check_full_attention_cache(self) -> None:
        layer_kinds = {type(layer) for layer in DynamicCache(config=self.model.config).layers}
        if layer_kinds - {DynamicLayer}:
            names = ", ".join(sorted(kind.__name__ for kind in layer_kinds))
            raise ValueError(
                f"HFCausalLMRunner supports full-attention KV caches only; {type(self.model).__name__} uses {names}"
            )


def causal_lm(
    model_path: str | Path,
    device: str = "cpu",
    *,
    stream_every: int = 1,
    max_batch: int = 32,
    hidden_layer: int | None = None,
    default_sampling: Mapping[str, Any] | None = None,
    prefill_chunk: int = 512,
) -> AutoregressiveScheduler:
    """Stage factory: a local transformers causal-LM checkpoint in the autoregressive scheduler.

    ``hidden_layer`` set: stream chunks and the result also carry that layer's hidden states.
    ``prefill_chunk``: prompt tokens prefilled per scheduler round (long prompts take several).
    """
    from omnictl.schedulers.autoregressive import AutoregressiveScheduler

    runner = HFCausalLMRunner.from_pretrained(model_path, device=device, hidden_layer=hidden_layer)
    return AutoregressiveScheduler(
        runner,
        stream_every=stream_every,
        max_batch=max_batch,
        emit_hidden=hidden_layer is not None,
        default_sampling=default_sampling,
        prefill_chunk=prefill_chunk,
    )

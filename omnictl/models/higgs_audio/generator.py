"""Higgs Audio v2's generator stage: the LLM that writes a frame of audio codes per step.

Each step of ``HiggsAudioV2ForConditionalGeneration`` scores every codebook of the next
audio frame at once (``num_codebooks`` x ``codebook_size`` logits from one head); the
codebooks run in a *delay pattern*: codebook ``c`` is ``c`` frames behind codebook 0, so
the first frame is all ``audio_stream_bos_id``, frame ``t`` has its first ``t`` codebooks
free, and once a codebook says ``audio_stream_eos_id`` the others follow one a step until
a frame is all end codes. Beside each frame transformers' ``generate`` writes a text
token: ``audio_token_id``, ``audio_delay_token_id`` once the end has begun, and
``eos_token_id`` after the all-end frame, which stops it.

:class:`GeneratorRunner` makes each frame as ``generate`` does: the same forward (the
prompt's text, then each frame's summed codebook embeddings through the audio MLPs),
transformers' own ``HiggsAudioV2DelayPatternLogitsProcessor`` on the scores, then each
codebook picked with the request's sampling (greedy: argmax, exactly ``do_sample=False``).
The scheduler's token is the text token ``generate`` writes, handed over as the only
token the scores allow; the scheduler stops on ``eos_token_id`` and counts ``max_tokens``
in frames (40 ms each at 25 Hz), as ``max_new_tokens`` does.

What leaves (:class:`GeneratorDelta`, :class:`GeneratorResult`): ``frames``, the frames as
generated (delayed, as ``generate``'s ``audio_sequences``), and ``codes``, the audio
tokenizer's frames: the delay undone as ``HiggsAudioV2Processor.decode`` undoes it, each
sent as soon as its last codebook exists (``num_codebooks - 1`` steps after its first),
codes outside the codec's codebook clipped into it as the processor does. The processor
starts at the last all-begin frame; here the first frame is that frame (a model that
says an all-begin frame again later is not followed there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import msgspec
import torch

from omnictl.models.higgs_audio.model import load_higgs
from omnictl.outputs import TokenDelta, TokenResult
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.runner import StepOutput
from omnictl.schedulers.sampling import Sampler, SamplingParams

# Boson AI's generation settings in its examples; a request's own sampling is laid over
# them. max_tokens counts frames (40 ms each).
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 0.3, "top_p": 0.95, "top_k": 50, "max_tokens": 1024}


class GeneratorDelta(TokenDelta):
    frames: Any = None  # [n, codebooks] long tensor: the frames generated since the last chunk, delayed
    codes: Any = None  # [m, codebooks] long tensor: the codec frames completed since the last chunk


class GeneratorResult(TokenResult):
    frames: Any = None  # every frame generated (the last all-end frame included when the model ended)
    codes: Any = None  # every codec frame


@dataclass(slots=True)
class _State:
    cache: Any
    delay: Any  # transformers' HiggsAudioV2DelayPatternLogitsProcessor, one per request (it keeps state)
    history: torch.Tensor  # [1, n]: the text tokens so far (prompt and generated), as generate's input_ids
    sampler: Sampler | None = None
    frames: list[torch.Tensor] = field(default_factory=list)  # [codebooks] each, as generated
    codes: list[torch.Tensor] = field(default_factory=list)  # [codebooks] each, the delay undone
    sent_frames: int = 0
    sent_codes: int = 0


class GeneratorRunner:
    """A Higgs Audio v2 checkpoint as an autoregressive runner whose every step is one audio frame."""

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        model = load_higgs(model_path, device)
        self.model = model
        self.device = next(model.parameters()).device
        config = model.config
        self.codebooks = int(config.num_codebooks)
        self.codebook_size = int(config.codebook_size)
        self.stream_bos = int(config.audio_stream_bos_id)
        self.stream_eos = int(config.audio_stream_eos_id)
        self.audio_token = int(config.audio_token_id)
        self.delay_token = int(config.audio_delay_token_id)
        eos = config.eos_token_id
        self.eos_token = int(eos[0] if isinstance(eos, (list, tuple)) else eos)
        self.vocab = int(config.vocab_size)
        self._states: dict[str, _State] = {}
        self._samplers: dict[str, Sampler] = {}  # set at the request's start, before its prefill

    def set_sampling(self, request_id: str, params: SamplingParams) -> None:
        """How this request's codebooks are picked (each codebook on its own, as ``generate`` does)."""
        self._samplers[request_id] = Sampler(params)

    def _delay_processor(self) -> Any:
        from transformers.models.higgs_audio_v2.generation_higgs_audio_v2 import (
            HiggsAudioV2DelayPatternLogitsProcessor,
        )

        # Exactly what HiggsAudioV2GenerationMixin._get_logits_processor builds.
        return HiggsAudioV2DelayPatternLogitsProcessor(
            delay_pattern=[el + 1 for el in range(self.codebooks)],
            audio_bos_token_id=int(self.model.config.audio_bos_token_id),
            audio_eos_token_id=self.delay_token,
            audio_stream_bos_id=self.stream_bos,
            audio_stream_eos_id=self.stream_eos,
            num_codebooks=self.codebooks,
            codebook_size=self.codebook_size,
        )

    @torch.inference_mode()
    def prefill(self, request_id: str, inputs: Mapping[str, Any]) -> StepOutput:
        from transformers import DynamicCache

        ids = torch.as_tensor(inputs["input_ids"], dtype=torch.long).reshape(1, -1)
        state = _State(cache=DynamicCache(config=self.model.config), delay=self._delay_processor(), history=ids)
        state.sampler = self._samplers.pop(request_id, None)
        self._states[request_id] = state
        out = self.model(input_ids=ids.to(self.device), cache=state.cache, use_cache=True, logits_to_keep=1)
        output = self._next(state, out.logits[0, -1])
        output.prompt_tokens = int(ids.shape[1])
        return output

    @torch.inference_mode()
    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        # One request at a time, each with its own cache (the HF reference runner).
        return [self._step(rid, token) for rid, token in zip(request_ids, token_ids)]

    def _step(self, request_id: str, token: int) -> StepOutput:
        state = self._states[request_id]
        if token != int(state.history[0, -1]):
            raise RuntimeError(f"Higgs Audio generator: stepped with token {token}, its last is {state.history[0, -1]}")
        # generate's decoding step: the last frame alone, through the audio path.
        frame = state.frames[-1].reshape(1, 1, -1).to(self.device)
        out = self.model(audio_input_ids=frame, cache=state.cache, use_cache=True, logits_to_keep=1)
        return self._next(state, out.logits[0, -1])

    def _next(self, state: _State, logits: torch.Tensor) -> StepOutput:
        """The frame these logits make, kept; the scores of the text token generate writes beside it."""
        scores = state.delay(state.history, logits.float().reshape(1, -1).cpu())  # [codebooks, codebook_size]
        if state.sampler is None or state.sampler.params.temperature == 0.0:
            frame = torch.argmax(scores, dim=-1)
        else:
            frame = torch.tensor([state.sampler.sample(row) for row in scores], dtype=torch.long)
        frame = frame.to(torch.long)
        state.frames.append(frame)
        self._undelay(state)
        ended = bool((frame == self.stream_eos).all())
        if ended:
            text = self.eos_token
        elif bool((frame == self.stream_eos).any()) or int(state.history[0, -1]) == self.delay_token:
            text = self.delay_token
        else:
            text = self.audio_token
        state.history = torch.cat([state.history, torch.tensor([[text]])], dim=1)
        only = torch.full((self.vocab,), float("-inf"))
        only[text] = 0.0
        return StepOutput(logits=only)

    def _undelay(self, state: _State) -> None:
        """Codec frame ``j`` is complete once frame ``j + codebooks`` was generated (frame 0 is
        the all-begin frame); the all-end frame completes nothing."""
        latest = len(state.frames) - 1
        frame = state.frames[-1]
        if latest < self.codebooks or bool((frame == self.stream_eos).all()):
            return
        first = latest - self.codebooks  # the codec frame whose last codebook this frame holds
        code = torch.stack([state.frames[first + 1 + c][c] for c in range(self.codebooks)])
        state.codes.append(code.clamp(0, self.stream_bos - 1))  # as the processor's decode clips

    def take(self, request_id: str, *, final: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(frames, codes) not handed out yet for this request; every one when ``final``."""
        state = self._states.get(request_id)
        if state is None:
            empty = torch.zeros(0, self.codebooks, dtype=torch.long)
            return empty, empty
        start_frames, start_codes = (0, 0) if final else (state.sent_frames, state.sent_codes)
        frames, codes = state.frames[start_frames:], state.codes[start_codes:]
        state.sent_frames, state.sent_codes = len(state.frames), len(state.codes)
        return self._stack(frames), self._stack(codes)

    def _stack(self, rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(rows) if rows else torch.zeros(0, self.codebooks, dtype=torch.long)

    def release(self, request_id: str) -> None:
        # The frames stay until the result took them (forget): release comes first.
        state = self._states.get(request_id)
        if state is not None:
            state.cache = None
        self._samplers.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        self._states.pop(request_id, None)
        self._samplers.pop(request_id, None)

    def stop_token_ids(self) -> set[int]:
        return {self.eos_token}

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return ""  # placeholders for audio frames, not text

    def kv_slots(self) -> int:
        return sum(1 for state in self._states.values() if state.cache is not None)


def speech_sampling(params: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A request's sampling: a chat request's ``sampling``, or a speech request's (``/v1/audio/speech``)."""
    from omnictl.inputs import SPEECH_SAMPLING

    own = params.get("sampling")
    return own if own is not None else params.get(SPEECH_SAMPLING)


class GeneratorScheduler(AutoregressiveScheduler):
    runner: GeneratorRunner

    def __init__(self, runner: GeneratorRunner, *, max_batch: int = 32, sampling: Mapping[str, Any]) -> None:
        super().__init__(runner, max_batch=max_batch, default_sampling=sampling)

    def request_sampling(self, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return speech_sampling(params)

    def on_start(self, request_id: str, sampling: SamplingParams) -> None:
        self.runner.set_sampling(request_id, sampling)

    def on_output(self, request_id: str, data: Any, *, final: bool) -> Any:
        frames, codes = self.runner.take(request_id, final=final)
        cls = GeneratorResult if final else GeneratorDelta
        extended = cls(**msgspec.structs.asdict(data), frames=frames, codes=codes)
        if final:
            self.runner.forget(request_id)
        return extended

    def on_drop(self, request_id: str) -> None:
        self.runner.forget(request_id)

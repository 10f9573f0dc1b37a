"""The voice assistant's topology entry points: factories, ``route_input`` and ``merge_question``.

``topologies/voice-assistant.yaml`` wires them::

    preprocessing --route_input--> asr --> thinker     (a spoken question)
                  |                   \\--> transcript  (what was heard; /v1/audio/transcriptions)
                  |------------------------> thinker     (a typed one)
                  \\------------------------> tts         (text to speak as is; /v1/audio/speech)
    thinker --stream + result--> decode (text), tts (audio)

preprocessing receives the request (an :class:`omnictl.inputs.ChatRequest` from the HTTP
server, or the ``{"messages", "sampling", "voice"}`` dict from Python callers), or a
microphone's audio as a streamed input (the listening half: a realtime turn, sent while it is
spoken): then it passes each chunk on to ``asr`` as it comes (``stream_to``), and at the
input's end sends ``{"listened": True}``, which ``route_input`` sends to ``asr``, whose
result is then the transcript of what streamed (:class:`ListeningEntry`). ``asr`` is one
Whisper for both: a whole question decoded at once, a streamed one while it arrives
(:func:`asr`). Data
between stages: preprocessing emits ``{"messages": [...]}`` whose spoken parts
are placeholders ``{"type": "audio", "key": k}`` plus ``{"audio": {k: float32 16 kHz}}``;
asr replaces each placeholder by its transcript and drops the audio; the thinker gets
``{"messages": [{"role", "content": str}, ...]}``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Generator, Mapping, Sequence

import numpy as np

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import (
    AudioPart,
    ChatRequest,
    ImagePart,
    RecognitionOptions,
    SpeechRequest,
    TextPart,
    as_chat_request,
    decode_audio,
)
from omnictl.models.voice_assistant.asr import SAMPLE_RATE, SpeechRecognizer
from omnictl.models.voice_assistant.asr_stream import StreamingAsrScheduler
from omnictl.models.voice_assistant.incremental_asr import IncrementalSettings, WhisperDecoder
from omnictl.models.voice_assistant.speech_scheduler import SentenceSpeechScheduler
from omnictl.models.voice_assistant.text_terminal import TextTerminalScheduler
from omnictl.models.voice_assistant.transcript_terminal import TranscriptTerminalScheduler
from omnictl.models.voice_assistant.tts import DEFAULT_VOICE, FIRST_WORDS, VOICES
from omnictl.outputs import TextResult, Transcript
from omnictl.playback.policy import DEFAULT_POLICY, DEFAULT_TTFP_TARGET_S
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, OutgoingMessage, Scheduler
from omnictl.schedulers.simple import SimpleScheduler

Data = dict[str, Any]


log = logging.getLogger(__name__)

# auto: vllm where vLLM is installed, else hf (docs/engine.md, "Which engine is the default").
ENGINES = ("auto", "hf", "vllm")
# The vLLM thinker's KV block on the CPU (factory_args.vllm.block_size overrides it).
CPU_BLOCK_SIZE = 32


def _check_voice(voice: str | None) -> None:
    if voice is not None and voice not in VOICES:
        raise InvalidRequest(
            f"voice: {voice!r} is not installed; choose one of {', '.join(sorted(VOICES))}", field="voice"
        )


def prepare_question(inputs: ChatRequest | SpeechRequest | Mapping[str, Any]) -> Data:
    """Keep the request's text, resample its (already decoded) spoken parts to 16 kHz, drop
    everything else. Takes the typed request (HTTP) or the dict (Python API). A
    :class:`SpeechRequest` becomes ``{"speak": TextResult}``: text for the TTS alone."""
    if isinstance(inputs, SpeechRequest):
        _check_voice(inputs.voice)
        return {"speak": TextResult(text=inputs.text)}
    request = as_chat_request(inputs)
    _check_voice(request.voice)
    messages: list[Data] = []
    audio: dict[str, np.ndarray] = {}
    for i, message in enumerate(request.messages):
        content: list[Data] = []
        for j, part in enumerate(message.parts):
            if isinstance(part, TextPart):
                content.append({"type": "text", "text": part.text})
            elif isinstance(part, AudioPart):
                key = f"m{i}_p{j}"
                audio[key] = decode_audio(part, SAMPLE_RATE)
                content.append({"type": "audio", "key": key})
            elif isinstance(part, ImagePart):
                raise InvalidRequest(f"{part.field}: the voice assistant does not read images", field=part.field)
        messages.append({"role": message.role, "content": content if audio else _joined(content)})
    if not audio:
        return {"messages": messages}
    data: Data = {"messages": messages, "audio": audio, "language": request.language}
    if request.recognition is not None:  # a transcription or translation request
        data["recognition"] = request.recognition
    return data


def _joined(content: list[Data]) -> str:
    return " ".join(part["text"].strip() for part in content if part["text"].strip())


class ListeningEntry(SimpleScheduler):
    """The entry: a whole request is :func:`prepare_question`'s (as a plain function stage
    runs it); a streamed input (``Pipeline.submit(None, input_stream=True)``: a realtime
    turn's microphone) is passed on chunk by chunk as it comes, untouched, to the stage it
    streams to (``asr``), and its end becomes this stage's result, ``{"listened": True}``."""

    def offer(self, message: IncomingMessage) -> bool:
        # On the loop, as each chunk comes: nothing to compute, so no hop to the worker thread.
        if message.kind is IncomingKind.STREAM_CHUNK:
            self.emit(OutgoingMessage(OutgoingKind.STREAM, message.request_id, message.data))
            return True
        if message.kind is IncomingKind.STREAM_DONE:
            self.emit(OutgoingMessage(OutgoingKind.RESULT, message.request_id, {"listened": True}))
            return True
        return super().offer(message)


def preprocessing() -> Scheduler:
    return ListeningEntry(prepare_question)


def route_input(data: Data) -> str:
    """Text to speak goes straight to ``tts``; a question with spoken parts, or the end of a
    streamed one, to ``asr``; a typed one straight to the ``thinker``."""
    if "speak" in data:
        return "tts"
    return "asr" if data.get("audio") or data.get("listened") else "thinker"


def transcribe_question(recognizer: SpeechRecognizer, data: Data) -> Data:
    """Each spoken part becomes the text Whisper heard in it; the audio is dropped here."""
    audio: Mapping[str, np.ndarray] = data["audio"]
    messages = []
    heard, language, seconds = "", data.get("language"), 0.0
    for message in data["messages"]:
        content = message["content"]
        if isinstance(content, list):
            parts = []
            for part in content:
                if part["type"] == "audio":
                    samples = np.asarray(audio[part["key"]])
                    heard, language = recognizer.recognize(samples, SAMPLE_RATE, data.get("language"))
                    seconds = samples.size / SAMPLE_RATE
                    parts.append({"type": "text", "text": heard})
                else:
                    parts.append(part)
            content = _joined(parts)
        messages.append({"role": message["role"], "content": content})
    return {"messages": messages, "transcript": Transcript(text=heard, language=language, duration=seconds)}


def recognize_clip(recognizer: SpeechRecognizer, data: Data) -> Generator[Transcript, None, Data]:
    """A transcription or translation request (``data["recognition"]``): Whisper's segments
    of the request's spoken part, each streamed as soon as it is decoded when the request
    asked for a stream; returns the data ``transcribe_question`` would, with the segments."""
    options: RecognitionOptions = data["recognition"]
    keys = [
        part["key"]
        for message in data["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "audio"
    ]
    samples = np.asarray(data["audio"][keys[-1]])
    decoded, language = recognizer.decode(samples, SAMPLE_RATE, data.get("language"), options)
    segments = []
    for segment in decoded:
        segments.append(segment)
        if options.stream:
            yield Transcript(text=segment.text, language=language, segments=[segment], task=options.task)
    text = "".join(segment.text for segment in segments).strip()
    heard = Transcript(
        text=text,
        language=language,
        duration=samples.size / SAMPLE_RATE,
        segments=segments if options.timestamps or options.words or options.stream else [],
        task=options.task,
    )
    return {"messages": [{"role": "user", "content": text}], "transcript": heard}


def asr(
    beam_size: int = 1,
    language: str | None = "en",
    temperatures: float | list[float] = 0.0,
    vad_filter: bool = False,
    initial_prompt: str | None = None,
    without_timestamps: bool = True,
    window_padding_s: float | None = None,
    cpu_threads: int = 0,
    listening: Mapping[str, Any] | None = None,
) -> Scheduler:
    """Whisper base, loaded once, for both a whole question and a streamed one (what
    :class:`ListeningEntry` passes on while the user speaks: decoded incrementally,
    :class:`~omnictl.models.voice_assistant.asr_stream.StreamingAsrScheduler`). Every decoding
    setting is a ``factory_args`` key (see :class:`SpeechRecognizer`); ``listening`` holds the
    incremental decoder's own (``cadence_s``, ``pass_beam_size``, ``holdback_words``,
    ``agreement``, ``max_segment_s``, ``quiet_rms``: see
    :class:`~omnictl.models.voice_assistant.incremental_asr.IncrementalSettings`), whose beam and
    window padding are this stage's, so a streamed turn's final transcript is decoded as a
    whole one would be."""
    recognizer, whole = _whole_asr(
        beam_size, language, temperatures, vad_filter, initial_prompt, without_timestamps, window_padding_s, cpu_threads
    )
    known = {"cadence_s", "pass_beam_size", "holdback_words", "agreement", "max_segment_s", "quiet_rms"}
    unknown = sorted(set(listening or {}) - known)
    if unknown:
        raise ValueError(
            f"factory_args.listening: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    settings = IncrementalSettings(
        beam_size=beam_size, window_padding_s=8.0 if window_padding_s is None else window_padding_s, **(listening or {})
    )
    language = language or "en"
    decoder = WhisperDecoder(recognizer.model, language)  # the same model: one Whisper in memory
    return StreamingAsrScheduler(decoder, settings, language=language, whole=whole, result_on="request")


def _whole_asr(
    beam_size: int,
    language: str | None,
    temperatures: float | list[float],
    vad_filter: bool,
    initial_prompt: str | None,
    without_timestamps: bool,
    window_padding_s: float | None,
    cpu_threads: int,
) -> tuple[SpeechRecognizer, Callable[[Data], Generator[Transcript, None, Data]]]:
    """The recogniser, and a whole request's decode with it: a question's spoken parts, or a
    transcription's clip."""
    recognizer = SpeechRecognizer(
        language=language,
        beam_size=beam_size,
        temperatures=temperatures,
        vad_filter=vad_filter,
        initial_prompt=initial_prompt,
        without_timestamps=without_timestamps,
        window_padding_s=window_padding_s,
        cpu_threads=cpu_threads,
    )

    def run(data: Data) -> Generator[Transcript, None, Data]:  # a generator: a transcription may stream its segments
        if data.get("recognition") is not None:
            result: Data = yield from recognize_clip(recognizer, data)
            return result
        return transcribe_question(recognizer, data)

    return recognizer, run


def transcript() -> Scheduler:
    """The ``transcript`` terminal: what ``asr`` heard in the request's last spoken part,
    and each segment ``asr`` streams as it decodes (a streamed transcription)."""
    return TranscriptTerminalScheduler()


def merge_answer(inputs: Mapping[str, Any]) -> TextResult:
    """What ``tts`` speaks: the thinker's answer, or the text a speech request brought."""
    if "thinker" in inputs:
        answer: TextResult = inputs["thinker"]
        return answer
    if "preprocessing" in inputs:
        spoken: TextResult = inputs["preprocessing"]["speak"]
        return spoken
    raise ValueError(f"merge_answer: expected input from 'thinker' or 'preprocessing', got {sorted(inputs)}")


def merge_question(inputs: Mapping[str, Data]) -> Data:
    """The thinker's prompt: the transcribed conversation if asr ran, else the typed one."""
    source = inputs.get("asr") or inputs.get("preprocessing")
    if source is None:
        raise ValueError(f"merge_question: expected input from 'asr' or 'preprocessing', got {sorted(inputs)}")
    return {"messages": source["messages"]}


def thinker(
    model_path: str | None = None,
    device: str = "cpu",
    max_tokens: int = 128,
    temperature: float = 0.0,
    system_prompt: str | None = None,
    repetition_penalty: float = 1.0,
    no_repeat_ngram: int = 0,
    max_sentences: int | None = None,
    stream_every: int = 1,
    max_batch: int = 16,
    threads: int | None = None,
    engine: str = "auto",
    vllm: Mapping[str, Any] | None = None,
    audio_policy: str = DEFAULT_POLICY,
    audio_s_per_token: float = 0.25,
) -> Scheduler:
    """SmolLM2-135M-Instruct (converted from the packaged GGUF on first use) on ``engine``.

    ``engine``: ``hf`` (the transformers runner in the autoregressive scheduler),
    ``vllm`` (:class:`~omnictl.schedulers.vllm_engine.VllmScheduler`, whose engine knobs
    are the ``vllm`` mapping: see :class:`~omnictl.schedulers.vllm_engine.VllmOptions`;
    without vLLM installed, one error naming the extra) or ``auto`` (the default: ``vllm``
    where vLLM is installed, else ``hf``; both give the same greedy answers, vLLM faster,
    see docs/engine.md).
    ``max_tokens`` and ``temperature`` are defaults; a request's ``sampling`` overrides them.
    ``system_prompt`` (used when the conversation has none), ``repetition_penalty``,
    ``no_repeat_ngram`` and ``max_sentences`` shape the spoken answer: see
    :class:`~omnictl.models.voice_assistant.answer_runner.SpokenAnswerRunner`; on vLLM
    only ``system_prompt`` and ``max_sentences`` (penalties there would also count the
    prompt's tokens, which the HF runner deliberately does not).
    ``max_batch`` and ``threads`` (torch's intra-op threads in this process; 0: every
    core it may run on; null: what the launcher's ``OMP_NUM_THREADS`` split gave it) are
    the HF runner's; vLLM's engine batches up to ``vllm.max_num_seqs`` and binds its own threads.
    ``audio_policy`` (``serve --audio-policy``): with ``deadline``, the HF runner's batch
    slots go to the answers whose speech is nearest starvation, a token counted as
    ``audio_s_per_token`` of speech (Piper speaks about four SmolLM2 tokens a second);
    vLLM schedules its own batch.
    """
    from omnictl.models.voice_assistant.llm import smollm2_checkpoint

    if engine not in ENGINES:
        raise ValueError(f"factory_args.engine: must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "auto":
        from omnictl.schedulers.vllm_engine import vllm_installed

        engine = "vllm" if vllm_installed() else "hf"
        if engine == "hf":
            # Engine options given with auto apply only when vLLM is chosen.
            log.info(
                "thinker: engine auto -> hf (vLLM is not installed; pip install 'omnictl[vllm]' for the faster engine)"
            )
    elif engine == "hf" and vllm is not None:
        raise ValueError("factory_args.vllm: engine options apply to engine: vllm or auto only (engine is 'hf')")
    if engine == "vllm":
        return _vllm_thinker(
            model_path,
            device,
            max_tokens,
            temperature,
            system_prompt,
            repetition_penalty,
            no_repeat_ngram,
            max_sentences,
            stream_every,
            vllm,
        )

    from omnictl.models.voice_assistant.answer_runner import SpokenAnswerRunner
    from omnictl.models.voice_assistant.llm import load_smollm2, set_threads
    from omnictl.schedulers.autoregressive import AutoregressiveScheduler

    set_threads(threads)
    model, tokenizer = load_smollm2(device, Path(model_path) if model_path else smollm2_checkpoint())
    runner = SpokenAnswerRunner(
        model,
        tokenizer,
        system_prompt=system_prompt,
        repetition_penalty=repetition_penalty,
        no_repeat_ngram=no_repeat_ngram,
        max_sentences=max_sentences,
    )
    return AutoregressiveScheduler(
        runner,
        stream_every=stream_every,
        max_batch=max_batch,
        default_sampling={"max_tokens": max_tokens, "temperature": temperature},
        audio_policy=audio_policy,
        audio_s_per_token=audio_s_per_token,
    )


def sentence_cap(max_sentences: int) -> Callable[[str], bool]:
    """``text -> bool``: whether an answer so far has said ``max_sentences`` sentences (the
    vLLM thinker's ``stop_when``; the HF runner forces end-of-answer at the same point)."""
    from omnictl.models.voice_assistant.sentences import sentences_ended

    def answer_is_done(text: str) -> bool:
        return sentences_ended(text) >= max_sentences

    return answer_is_done


def _vllm_thinker(
    model_path: str | None,
    device: str,
    max_tokens: int,
    temperature: float,
    system_prompt: str | None,
    repetition_penalty: float,
    no_repeat_ngram: int,
    max_sentences: int | None,
    stream_every: int,
    vllm: Mapping[str, Any] | None,
) -> Scheduler:
    from omnictl.models.voice_assistant.llm import smollm2_checkpoint
    from omnictl.schedulers.vllm_engine import VllmOptions, VllmScheduler, require_vllm

    require_vllm()  # first: the one error a machine without vLLM gets
    if repetition_penalty != 1.0:
        raise ValueError(
            f"factory_args.repetition_penalty: engine vllm supports 1.0 (off) only, got {repetition_penalty}"
        )
    if no_repeat_ngram != 0:
        raise ValueError(f"factory_args.no_repeat_ngram: engine vllm supports 0 (off) only, got {no_repeat_ngram}")
    if max_sentences is not None and max_sentences < 1:
        raise ValueError(f"max_sentences: must be >= 1 or null (no cap), got {max_sentences}")
    from omnictl.models.tensor_parallel import engine_ranks

    # A `tp_size` stage: vLLM runs the ranks (tensor_parallel_size); omnictl starts none.
    # On the CPU, KV blocks of 32 tokens rather than vLLM's 128: prefix caching reuses whole
    # blocks only, and a voice turn adds ~30 tokens, so with 128 most turns reused nothing of
    # the conversation before them (benchmarks/turn_prefill.py: turn-5 time to first token
    # 1.13x turn 1's with 32, 1.41x with 128, 2.5x without caching).
    defaults = {"block_size": CPU_BLOCK_SIZE} if device == "cpu" else {}
    options = VllmOptions.from_mapping(
        {"device": device, "tensor_parallel_size": engine_ranks(), **defaults, **(vllm or {})}
    )
    return VllmScheduler(
        str(Path(model_path) if model_path else smollm2_checkpoint()),
        options,
        system_prompt=system_prompt,
        stop_when=sentence_cap(max_sentences) if max_sentences is not None else None,
        default_sampling={"max_tokens": max_tokens, "temperature": temperature},
        stream_every=stream_every,
    )


def decode() -> Scheduler:
    return TextTerminalScheduler()


def tts(
    voice: str = DEFAULT_VOICE,
    max_sentence_chars: int = 250,
    audio_policy: str = DEFAULT_POLICY,
    ttfp_target_s: float = DEFAULT_TTFP_TARGET_S,
    first_words: Sequence[int] | None = FIRST_WORDS,
) -> Scheduler:
    """``audio_policy``: which request's sentence is spoken next (``serve --audio-policy``);
    ``ttfp_target_s``: a new request's first sentence is due this long after it arrives;
    ``first_words`` ([min, max]): the first piece spoken is a clause of that many words, so
    first audio waits for a few tokens, not the first sentence (null: a whole sentence, as
    before; for comparison: ``benchmarks/first_audio.py --set tts.first_words=null``)."""
    if first_words is not None and (
        len(first_words) != 2
        or not all(isinstance(n, int) for n in first_words)
        or not 1 <= first_words[0] <= first_words[1]
    ):
        raise ValueError(
            f"factory_args.first_words: must be [min, max] with 1 <= min <= max, or null; got {first_words!r}"
        )
    scheduler = SentenceSpeechScheduler(
        default_voice=voice,
        max_sentence_chars=max_sentence_chars,
        audio_policy=audio_policy,
        ttfp_target_s=ttfp_target_s,
        first_words=(first_words[0], first_words[1]) if first_words is not None else None,
    )
    scheduler.speaker(voice)  # load the voice now, not when the first sentence is due
    return scheduler


def tts_voices() -> list[str]:
    """The Piper voices installed (what ``voice`` accepts): ``GET /v1/audio/voices`` reads them."""
    return sorted(VOICES)


tts.voices = tts_voices  # type: ignore[attr-defined]  # a factory function carries its voices as an attribute (read by /v1/audio/voices)

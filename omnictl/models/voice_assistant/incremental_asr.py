"""Incremental speech recognition: transcribe while the user speaks.

:class:`IncrementalTranscriber` takes a growing 16 kHz buffer and, every ``cadence_s`` of
new audio, re-decodes it with Whisper (the window fitted to the clip, as
``SpeechRecognizer(window_padding_s=...)`` does). A word is *confirmed* when two passes in a
row (``agreement``) agree on it (LocalAgreement-2, as in whisper_streaming) and it is not the last word the
newer pass heard (a word at the edge of the audio may still be cut). Confirmed words never
change: each later pass starts its decoder with their tokens forced as the prefix, so when
speech stops only the words after them are left to decode (a tentative transcript at a
pause). The final decode is Whisper's own decode of the whole segment when it begins with the
confirmed words (it is then today's whole-utterance transcript), else the forced one. The text
of the conversation so far (``context``) primes the decoder as Whisper's previous-text
prompt.

The class is pure: no threads, no I/O; :meth:`feed` returns the newly confirmed text (the
delta to stream), :meth:`finish` the final transcript, which always begins with every delta
:meth:`feed` returned (deltas concatenate to it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnictl.models.voice_assistant.asr import _FRAMES_PER_S, _MAX_NEW_TOKENS, SAMPLE_RATE, WHISPER_WINDOW_S

REUSE_QUIET_S = 0.15  # quiet a pass must end with to be a pause's transcript (see _pass_heard_the_end)
_MAX_PROMPT_TOKENS = 223 - 4  # Whisper's previous-text prompt is capped at half its 448 positions, less the start


@dataclass(frozen=True, slots=True)
class IncrementalSettings:
    """How an :class:`IncrementalTranscriber` decodes.

    cadence_s: re-decode once this much new audio has arrived since the last pass (the CPU
        spent while the user speaks: one pass per ``cadence_s`` of speech at most).
    beam_size: the final decode's beam (the whole-utterance decode's, for the same transcript).
    pass_beam_size: the beam of the passes made while audio arrives (None: ``beam_size``).
    window_padding_s: silence the encoder sees after the clip (see ``SpeechRecognizer``).
    max_segment_s: audio held at most; longer input is cut here into segments, each
        finished on its own, its text the next one's prompt (Whisper hears 30 s at most).
    holdback_words: the newest words of a pass never confirmed by it (they may be cut).
    agreement: how many passes in a row must agree on a word to confirm it (2:
        LocalAgreement-2; 3 waits a pass longer and confirms fewer early mishearings).
    quiet_rms: when every sample after the last pass is quieter than this (RMS, full scale
        1.0), the speech ended before that pass and its words are the final transcript: no
        decode is left when the input ends (only when that pass was a
        :meth:`IncrementalTranscriber.tentative` one, made at a pause: its words are what an
        answer started there heard; after a pass made while audio arrives, the final decode is
        made, see :meth:`IncrementalTranscriber.finish`). 0 turns this off.
    """

    cadence_s: float = 0.4
    beam_size: int = 5
    pass_beam_size: int | None = None
    window_padding_s: float = 8.0
    max_segment_s: float = 20.0
    holdback_words: int = 1
    agreement: int = 2
    quiet_rms: float = 0.01

    def __post_init__(self) -> None:
        if not self.cadence_s > 0:
            raise ValueError(f"cadence_s: must be > 0 seconds, got {self.cadence_s}")
        if self.beam_size < 1 or (self.pass_beam_size is not None and self.pass_beam_size < 1):
            raise ValueError(f"beam_size, pass_beam_size: must be >= 1, got {self.beam_size}, {self.pass_beam_size}")
        if not 0 <= self.window_padding_s < WHISPER_WINDOW_S:
            raise ValueError(f"window_padding_s: must be in [0, {WHISPER_WINDOW_S:g}), got {self.window_padding_s}")
        if self.max_segment_s <= 0 or self.max_segment_s + self.window_padding_s > WHISPER_WINDOW_S:
            raise ValueError(
                f"max_segment_s: must be > 0 and fit Whisper's {WHISPER_WINDOW_S:g} s window with the "
                f"{self.window_padding_s:g} s of padding, got {self.max_segment_s}"
            )
        if self.quiet_rms < 0:
            raise ValueError(f"quiet_rms: must be >= 0, got {self.quiet_rms}")
        if self.agreement < 2:
            raise ValueError(f"agreement: must be >= 2 passes, got {self.agreement}")
        if self.holdback_words < 0:
            raise ValueError(f"holdback_words: must be >= 0, got {self.holdback_words}")


class WhisperDecoder:
    """Whisper base's encoder and decoder called directly on a fitted window, with a
    previous-text prompt and a forced prefix: what every transcriber of a process shares
    (the model is loaded once; CTranslate2 calls are safe from one thread at a time)."""

    def __init__(self, model: Any, language: str = "en") -> None:
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self.model = model  # a faster_whisper.WhisperModel
        self.tokenizer = Tokenizer(model.hf_tokenizer, True, task="transcribe", language=language)
        self._start = [*self.tokenizer.sot_sequence, self.tokenizer.no_timestamps]
        self._suppress = list(get_suppressed_tokens(self.tokenizer, [-1]))
        vocab = self.tokenizer.tokenizer
        self._word_start = np.array(
            [str(vocab.id_to_token(i) or "").startswith("Ġ") for i in range(self.tokenizer.eot)], dtype=bool
        )

    @classmethod
    def load(cls, language: str = "en", cpu_threads: int = 0) -> WhisperDecoder:
        import os

        from faster_whisper import WhisperModel

        from omnictl.models.voice_assistant.asr import whisper_base_dir

        threads = cpu_threads or len(os.sched_getaffinity(0))
        model = WhisperModel(str(whisper_base_dir()), device="cpu", compute_type="int8", cpu_threads=threads)
        return cls(model, language)

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(" " + text.strip())) if text.strip() else []

    def text(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens)).strip()

    def starts_word(self, token: int) -> bool:
        return bool(token < self._word_start.size and self._word_start[token])

    def decode(
        self, audio: np.ndarray, *, padding_s: float, beam_size: int, prompt: list[int], prefix: list[int]
    ) -> list[int]:
        """The tokens Whisper hears in ``audio`` (16 kHz), beginning with ``prefix`` (forced)."""
        import ctranslate2

        frames = min(math.ceil((audio.size / SAMPLE_RATE + padding_s) * _FRAMES_PER_S), int(WHISPER_WINDOW_S * 100))
        features = self.model.feature_extractor(audio)[:, :frames]
        window = np.zeros((features.shape[0], frames), dtype=np.float32)
        window[:, : features.shape[1]] = features
        encoded = self.model.model.encode(ctranslate2.StorageView.from_array(window[None]), to_cpu=False)
        head = [self.tokenizer.sot_prev, *prompt[-_MAX_PROMPT_TOKENS:]] if prompt else []
        start = [*head, *self._start, *prefix]
        result = self.model.model.generate(
            encoded,
            [start],
            beam_size=beam_size,
            max_length=len(start) + _MAX_NEW_TOKENS,
            suppress_blank=not prefix,  # a blank is only suppressed at the start of the text
            suppress_tokens=self._suppress,
        )[0]
        tokens = [t for t in result.sequences_ids[0] if t < self.tokenizer.eot]
        if tokens[: len(prefix)] != prefix:  # CTranslate2 returns the forced prefix with the rest
            tokens = [*prefix, *tokens]
        return tokens


class IncrementalTranscriber:
    """One utterance, transcribed while it arrives (see the module docstring).

    ``feed(samples)`` (float32 16 kHz) -> the text newly confirmed ("" when none);
    ``finish()`` -> the final transcript. ``context``: text of the conversation so far.
    """

    def __init__(self, decoder: WhisperDecoder, settings: IncrementalSettings, context: str = "") -> None:
        self.decoder = decoder
        self.settings = settings
        self._context = decoder.encode_text(context)
        self._chunks: list[np.ndarray] = []
        self._samples = 0  # in this segment
        self._decoded_at = 0  # samples of this segment the last pass heard
        self._confirmed: list[int] = []  # this segment's confirmed tokens (forced from now on)
        # the last passes' tokens after the confirmed ones (agreement - 1 of them, newest last)
        self._history: list[list[int]] = []
        self._done_text = ""  # finished segments' text
        self._emitted = ""  # every delta returned so far
        self._finished: str | None = None
        self.passes = 0  # decodes made (the final one included)
        self.tentatives = 0  # transcripts asked for before the end (:meth:`tentative`)
        self.decoded_samples = 0  # audio the decodes heard, summed over them (each hears its segment)
        self.forced_finals = 0  # final decodes that had to force the confirmed words (see _final)
        self._pass_final = False  # the last pass decoded as the final would (a tentative one)

    @property
    def confirmed_text(self) -> str:
        return self._emitted

    def tentative(self) -> tuple[str, str]:
        """The whole transcript so far, for an answer started before the input ends (a pause):
        (the text newly confirmed, as :meth:`feed` returns it; the transcript so far). Only the
        tail is decoded: the confirmed words are forced as the prefix, and when only silence
        came since the last tentative decode, its words are the answer and nothing is decoded.
        The decode made here is a pass like any (it may confirm words), so when the input then
        ends with silence, :meth:`finish` decodes nothing either and gives this same transcript
        (the one the answer heard)."""
        if self._finished is not None:
            return "", self._finished
        if not self._samples:
            return "", self._done_text
        self.tentatives += 1
        # A pass made while audio arrived, at the final beam, that began after the speech had
        # ended heard all of it, as a tentative decode would (the same forced decode): its
        # words are the answer's, and the pause costs no decode.
        tokens = self._quiet_since_pass(any_pass=True)
        if tokens is not None:
            self._pass_final = True  # the answer heard it: finish() gives this transcript too
        delta = ""
        if tokens is None:
            delta = self._pass(final=True)
            tokens = [*self._confirmed, *self._history[-1]]
        return delta, _join(self._done_text, self.decoder.text(tokens))

    def feed(self, samples: np.ndarray, decode: bool = True) -> str:
        """Add audio; decode once if ``cadence_s`` of new audio has come since the last pass
        (``decode`` False: not now, e.g. a resampler's last few ms just before :meth:`finish`).
        Returns the text newly confirmed (to append to what was returned before)."""
        if self._finished is not None:
            raise RuntimeError("feed after finish")
        audio = np.asarray(samples, dtype=np.float32).reshape(-1)
        limit = int(self.settings.max_segment_s * SAMPLE_RATE)
        delta = ""
        while audio.size:
            room = limit - self._samples
            piece, audio = audio[:room], audio[room:]
            self._chunks.append(piece)
            self._samples += piece.size
            if self._samples >= limit:  # the segment is full: finish it; its text primes the next
                delta += self._close_segment()
        if decode and self._samples - self._decoded_at >= self.settings.cadence_s * SAMPLE_RATE and self._heard_since():
            delta += self._pass()
        return delta

    def _heard_since(self) -> bool:
        """Whether anything but silence (``quiet_rms``) came since the last pass: a pass over a
        pause or the silence ending a turn hears nothing new, and costs as much as any (a
        tentative or final decode hears that silence, when one is asked for)."""
        if self.settings.quiet_rms <= 0:
            return True
        after = self._audio()[self._decoded_at :]
        return bool(after.size) and _rms(after) >= self.settings.quiet_rms

    def finish(self) -> str:
        """The final transcript: the whole-utterance decode where it begins with the confirmed
        words, else the tail after them decoded with them forced (:meth:`_final`); no decode
        when only silence came after the last pass."""
        if self._finished is None:
            self._close_segment()
            self._finished = self._done_text
        return self._finished

    # --- internals ------------------------------------------------------------------------

    def _audio(self) -> np.ndarray:
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros(0, dtype=np.float32)

    def _decode(self, beam_size: int, forced: bool = True) -> list[int]:
        self.passes += 1
        self._decoded_at = self._samples
        self.decoded_samples += self._samples
        return self.decoder.decode(
            self._audio(),
            padding_s=self.settings.window_padding_s,
            beam_size=beam_size,
            prompt=self._context,
            prefix=self._confirmed if forced else [],
        )

    def _final(self) -> list[int]:
        """The segment's final decode: Whisper's own decode of the whole segment, as the
        whole-utterance decode hears it, when it begins with the words already confirmed
        (streamed: they cannot change); else the tail decoded after them, forced. Forcing
        alone let a word confirmed from a pass cut mid-word pull the tail off: G.711 speech
        sent faster than real time came out "What is a capital unfriend?", where the whole
        decode, which agreed with the confirmed words, heard "... on France?"."""
        beam = self.settings.beam_size
        if not self._confirmed:
            return self._decode(beam)
        free = self._decode(beam, forced=False)
        if free[: len(self._confirmed)] == self._confirmed:
            return free
        self.forced_finals += 1
        return self._decode(beam)

    def _pass(self, final: bool = False) -> str:
        """A decode of the segment so far (the confirmed words forced), whose words two passes
        in a row confirm. ``final``: a tentative transcript's, at the final beam, whose words
        are the final transcript when only silence follows (what an answer started at the pause
        heard); a pass made while audio arrives is not."""
        self._pass_final = final
        tokens = self._decode(
            self.settings.beam_size if final else self.settings.pass_beam_size or self.settings.beam_size
        )
        current = tokens[len(self._confirmed) :]
        if len(self._history) == self.settings.agreement - 1:
            agreed = min((self._agreed(previous, current) for previous in self._history), default=0)
            self._confirmed.extend(current[:agreed])
            current = current[agreed:]
            self._history = [previous[agreed:] for previous in self._history]  # each began with them
        self._history = [*self._history, current][-(self.settings.agreement - 1) :]
        return self._emit(self._done_text, self._confirmed)

    def _agreed(self, previous: list[int], current: list[int]) -> int:
        """How many leading tokens of ``current`` to confirm: whole words both passes agree
        on, less the ``holdback_words`` newest words of ``current``."""
        common = 0
        while common < min(len(previous), len(current)) and previous[common] == current[common]:
            common += 1
        starts = [i for i, token in enumerate(current) if i == 0 or self.decoder.starts_word(token)]
        if self.settings.holdback_words:
            cap = starts[-self.settings.holdback_words] if len(starts) >= self.settings.holdback_words else 0
            common = min(common, cap)

        def boundary(tokens: list[int], i: int) -> bool:  # a word ends before index i
            return i == len(tokens) or self.decoder.starts_word(tokens[i])

        while common > 0 and not (boundary(previous, common) and boundary(current, common)):
            common -= 1
        return common

    def _close_segment(self) -> str:
        if self._samples:
            tokens = self._quiet_since_pass() or self._final()
            self._done_text = _join(self._done_text, self.decoder.text(tokens))
            self._context = [*self._context, *tokens]
        delta = self._emit(self._done_text, [])
        self._chunks, self._samples, self._decoded_at = [], 0, 0
        self._confirmed, self._history, self._pass_final = [], [], False
        return delta

    def _quiet_since_pass(self, any_pass: bool = False) -> list[int] | None:
        """The last pass's tokens, if only silence came after it and it decoded as a final
        would (a tentative pass; ``any_pass``: or any pass at the final beam)."""
        settings = self.settings
        if not self._history or settings.quiet_rms <= 0:
            return None
        final_beam = settings.pass_beam_size in (None, settings.beam_size)
        if not (self._pass_final or (any_pass and final_beam and self._pass_heard_the_end())):
            return None
        after = self._audio()[self._decoded_at :]
        if after.size and _rms(after) >= settings.quiet_rms:
            return None
        return [*self._confirmed, *self._history[-1]]

    def _pass_heard_the_end(self) -> bool:
        """Whether the last pass's own audio ended in ``REUSE_QUIET_S`` of quiet: it heard the
        speech's end whole. A word's fading tail (the "v" of "have") is quieter than a turn's
        voice, and diluted in the silence after it, it passed for nothing new: a pass cut
        there heard "spider hat" where the decode at the pause heard "spider have"."""
        tail = self._audio()[: self._decoded_at][-int(REUSE_QUIET_S * SAMPLE_RATE) :]
        if tail.size < int(REUSE_QUIET_S * SAMPLE_RATE):
            return False
        return _rms(tail) < self.settings.quiet_rms

    def _emit(self, done: str, tokens: list[int]) -> str:
        text = _join(done, self.decoder.text(tokens))
        if not text.startswith(self._emitted):
            # cannot happen while confirmed tokens are forced: each text extends the last;
            # if a decode ever broke that, the deltas would no longer add up to the final text
            raise RuntimeError(f"confirmed text {text!r} does not extend what was streamed, {self._emitted!r}")
        delta, self._emitted = text[len(self._emitted) :], text
        return delta


def _rms(samples: np.ndarray) -> float:
    """Root mean square of a non-empty float signal (full scale 1.0), in float64."""
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))


def _join(head: str, tail: str) -> str:
    return f"{head} {tail}" if head and tail else head or tail

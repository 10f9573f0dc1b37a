"""One answer's text as its tokens arrive: the text-generation path of every autoregressive scheduler.

:class:`TextGeneration` is what the HF scheduler (:class:`~omnictl.schedulers.ar_request.ArRequest`)
and the vLLM scheduler (:class:`~omnictl.schedulers.vllm_engine.VllmScheduler`) both use to
turn a request's tokens into text, with the same rules:

- a stop token ends the answer without appearing in ``token_ids`` (it counts in
  ``completion_tokens``);
- a stop string ends it, and the text is cut where the earliest one begins; streamed text
  never holds any of it (a tail that could still grow into one is held back);
- ``max_tokens`` ends it with ``length``; ``stop_when`` (``text -> bool``) may end it after
  any token;
- a character whose bytes have not all arrived is never streamed.

Text is decoded incrementally by the ``tokenizers`` package's streaming decoder
(:class:`tokenizers.decoders.DecodeStream`, a bounded window of tokens per step) and stop
strings are looked for in a window as long as the longest stop string, so the work per
token does not grow with the answer's length (``benchmarks/detokenizer.py`` measures it).
A runner whose tokens are not a ``tokenizers`` tokenizer's (test doubles, a slow tokenizer)
gets :class:`WholeDecoder`, which decodes every token so far on each step, as this path
did before.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Protocol, Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from omnictl.outputs import FinishReason, TokenDelta, TokenResult
from omnictl.schedulers.sampling import SamplingParams, streamable_prefix


class TextDecoder(Protocol):
    """Token ids in, text out, one token at a time."""

    def step(self, token_id: int) -> str:
        """The text this token adds ("" while a character's bytes are incomplete)."""
        ...

    def whole(self) -> str:
        """The text of every token stepped so far, decoded at once (once, at the end)."""
        ...


class StreamDecoder:
    """A ``tokenizers`` tokenizer's streaming decoder; special tokens are left out of the text."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)
        self._ids: list[int] = []

    def step(self, token_id: int) -> str:
        self._ids.append(token_id)
        return self._stream.step(self._tokenizer, token_id) or ""

    def whole(self) -> str:
        return str(self._tokenizer.decode(self._ids, skip_special_tokens=True))


class WholeDecoder:
    """Any ``detokenize(token_ids) -> str``, asked for every token so far on each step.

    Its cost per token grows with the answer: it is for runners without a ``tokenizers``
    tokenizer. Text a detokenizer rewrote is not streamed again (only text that extends
    what was already given out is), and a trailing half character waits."""

    def __init__(self, detokenize: Callable[[Sequence[int]], str]) -> None:
        self._detokenize = detokenize
        self._ids: list[int] = []
        self._given = ""

    def step(self, token_id: int) -> str:
        self._ids.append(token_id)
        text = self._detokenize(self._ids).rstrip("\ufffd")
        if len(text) <= len(self._given) or not text.startswith(self._given):
            return ""
        piece, self._given = text[len(self._given) :], text
        return piece

    def whole(self) -> str:
        return self._detokenize(self._ids)


def stream_decoder_factory(tokenizer: Any) -> Callable[[], TextDecoder] | None:
    """New :class:`StreamDecoder` s for a ``transformers`` tokenizer, or None when it has no
    ``tokenizers`` backend or cleans up spaces after decoding (the stream would then differ
    from a whole decode; :class:`WholeDecoder` keeps the old text there)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer) or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    return lambda: StreamDecoder(backend)


class TextGeneration:
    """One request's generated tokens and text, from the first token to the result.

    ``add`` takes each sampled token and decides whether the answer ends with it; ``force``
    takes a token the caller already has (a lost attempt's, streamed before); ``chunk``
    gives what is new and safe to stream; ``text`` is the result's text once finished.
    """

    def __init__(
        self,
        params: SamplingParams,
        decoder: TextDecoder,
        stop_ids: Collection[int] = (),
        stop_when: Callable[[str], bool] | None = None,
    ) -> None:
        self.params = params
        self.stop_ids = stop_ids
        self.stop_when = stop_when
        self.token_ids: list[int] = []  # generated, without a final stop token
        self.completion_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.final_text: str | None = None  # set when a stop string ended the answer
        self.sent_tokens = 0
        self._decoder = decoder
        self._pieces: list[str] = []
        self._length = 0  # characters in the pieces
        self._sent_chars = 0  # characters streamed
        self._unsent = ""  # the text from _sent_chars on
        # The window at the end of the text that stop strings are looked for in and held
        # back from: what streamable_prefix reads, whatever the answer's length.
        self._window_chars = sum(len(s) - 1 for s in params.stop)
        self._tail = ""
        self._finished_text: str | None = None

    def add(self, token: int) -> None:
        """One sampled token; sets ``finish_reason`` when the answer ends with it."""
        self.completion_tokens += 1
        if token in self.stop_ids:
            self.finish_reason = FinishReason.STOP
            return
        self.token_ids.append(token)
        piece = self._append(token)
        if piece and self.params.stop:
            cut = self._stop_string_at(piece)
            if cut is not None:
                self.finish_reason, self.final_text = FinishReason.STOP, self._joined()[:cut]
                return
        if self.completion_tokens >= self.params.max_tokens:
            self.finish_reason = FinishReason.LENGTH
        elif self.stop_when is not None and self.stop_when(self._joined()):
            self.finish_reason = FinishReason.STOP

    def force(self, token: int) -> None:
        """A token the caller already received: taken as is, and counted as streamed
        (what was streamed of its text is what was safe to stream then)."""
        self.completion_tokens += 1
        self.token_ids.append(token)
        self._append(token)
        self.sent_tokens = len(self.token_ids)
        end = self._streamable_end()
        if end > self._sent_chars:
            self._unsent = self._unsent[end - self._sent_chars :]
            self._sent_chars = end
        if self.completion_tokens >= self.params.max_tokens:
            self.finish_reason = FinishReason.LENGTH

    def text(self) -> str:
        """The whole text when finished, else the part that is safe to stream."""
        if self.final_text is not None:
            return self.final_text
        if self.finish_reason is not None:
            if self._finished_text is None:
                self._finished_text = self._decoder.whole()
            return self._finished_text
        return self._joined()[: self._streamable_end()]

    @property
    def sent_text(self) -> str:
        """The text streamed so far."""
        return self._joined()[: self._sent_chars]

    @property
    def sent_nothing(self) -> bool:
        return self.sent_tokens == 0 and self._sent_chars == 0

    def chunk(self) -> TokenDelta | None:
        """The text and token ids new since the last chunk, or None when there is nothing new."""
        token_ids = self.token_ids[self.sent_tokens :]
        if self.finish_reason is not None:
            # Once, at the end: the result's text against what was streamed (a detokenizer
            # may have rewritten it; only text that extends what was sent goes out).
            text, sent = self.text(), self.sent_text
            delta = text[len(sent) :] if text.startswith(sent) else ""
        else:
            delta = self._unsent[: max(self._streamable_end() - self._sent_chars, 0)]
        if not token_ids and not delta:
            return None
        self.sent_tokens = len(self.token_ids)
        self._sent_chars += len(delta)
        self._unsent = self._unsent[len(delta) :]
        return TokenDelta(text=delta, token_ids=token_ids)

    def result(self, prompt_tokens: int) -> TokenResult:
        """The answer's result (its text, why it ended, the counts and its token ids)."""
        return TokenResult(
            text=self.text(),
            finish_reason=self.finish_reason or FinishReason.STOP,
            prompt_tokens=prompt_tokens,
            completion_tokens=self.completion_tokens,
            token_ids=list(self.token_ids),
        )

    # --- the text's end, in bounded windows ---------------------------------------------

    def _append(self, token: int) -> str:
        piece = self._decoder.step(token)
        if piece:
            self._pieces.append(piece)
            self._length += len(piece)
            self._unsent += piece
            if self._window_chars:
                self._tail = (self._tail + piece)[-self._window_chars :]
        return piece

    def _stop_string_at(self, piece: str) -> int | None:
        """Where the earliest stop string begins, if one ends in ``piece`` (the text before
        held none): looked for in the piece and as many characters before it as the
        longest stop string has, less one."""
        reach = max(len(s) for s in self.params.stop) - 1
        window = self._joined_tail(len(piece) + reach)
        found = [index for index in (window.find(s) for s in self.params.stop) if index >= 0]
        return self._length - len(window) + min(found) if found else None

    def _streamable_end(self) -> int:
        """How many characters of the text are safe to stream now."""
        if not self._window_chars:
            return self._length
        window = self._tail
        return self._length - (len(window) - len(streamable_prefix(window, self.params.stop)))

    def _joined_tail(self, chars: int) -> str:
        """The last ``chars`` characters of the text, from as few pieces as hold them."""
        taken: list[str] = []
        count = 0
        for piece in reversed(self._pieces):
            taken.append(piece)
            count += len(piece)
            if count >= chars:
                break
        return "".join(reversed(taken))[-chars:] if chars else ""

    def _joined(self) -> str:
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

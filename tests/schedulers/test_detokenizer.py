"""One answer's text as its tokens arrive (:mod:`omnictl.schedulers.detokenizer`), on a real
byte-level tokenizer (every byte a token, so a character of two to four bytes spans as many
tokens): what streams, what is held back, where a stop string cuts, and that all of it is
what decoding every token so far on each step gave (the reference below: the rules the HF
and vLLM paths each had before they shared this class)."""

from __future__ import annotations

from typing import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from omnictl.models.tiny_causal_lm import tiny_tokenizer
from omnictl.outputs import FinishReason, TokenResult
from omnictl.schedulers.detokenizer import StreamDecoder, TextGeneration, WholeDecoder, stream_decoder_factory
from omnictl.schedulers.sampling import SamplingParams, cut_at_stop, streamable_prefix

EOS_ID = 256


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Token i is byte i (byte-level BPE without merges), and 256 is ``<eos>``."""
    byte_chars: dict[int, str] = bytes_to_unicode()
    vocab = {byte_chars[byte]: byte for byte in range(256)}
    vocab["<eos>"] = EOS_ID
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


TOKENIZER = byte_tokenizer()
BACKEND = TOKENIZER.backend_tokenizer


def ids(text: str) -> list[int]:
    return list(text.encode())


def decode(token_ids: Sequence[int]) -> str:
    return str(TOKENIZER.decode(list(token_ids), skip_special_tokens=True))


def generation(max_tokens: int = 100, stop: tuple[str, ...] = (), **kwargs: object) -> TextGeneration:
    return TextGeneration(SamplingParams(max_tokens=max_tokens, stop=stop), StreamDecoder(BACKEND), {EOS_ID}, **kwargs)  # type: ignore[arg-type]


def streamed(text_generation: TextGeneration, tokens: Sequence[int]) -> list[tuple[str, list[int]]]:
    """Feed ``tokens`` one at a time until the answer ends, taking a chunk after each."""
    chunks = []
    for token in tokens:
        text_generation.add(token)
        chunk = text_generation.chunk()
        if chunk is not None:
            chunks.append((chunk.text, chunk.token_ids))
        if text_generation.finish_reason is not None:
            break
    return chunks


def test_a_character_split_over_tokens_streams_whole_once_its_last_byte_arrives() -> None:
    text_generation = generation()
    chunks = streamed(text_generation, ids("é日"))  # 2 + 3 bytes
    assert chunks == [("", [195]), ("é", [169]), ("", [230]), ("", [151]), ("日", [165])]
    text_generation.add(EOS_ID)
    assert text_generation.result(prompt_tokens=3) == TokenResult(
        text="é日", finish_reason=FinishReason.STOP, prompt_tokens=3, completion_tokens=6, token_ids=ids("é日")
    )


def test_a_stop_string_over_several_tokens_is_held_back_then_cut_and_never_streamed() -> None:
    text_generation = generation(stop=("END",))
    chunks = streamed(text_generation, ids("say ENough, ok END more"))
    assert "".join(text for text, _ in chunks) == "say ENough, ok "
    assert chunks[4] == ("", [ord("E")]) and chunks[6] == ("ENo", [ord("o")])  # "E", "EN" held, then let go
    assert text_generation.finish_reason is FinishReason.STOP and text_generation.text() == "say ENough, ok "
    assert text_generation.token_ids == ids("say ENough, ok END")  # the stop string's tokens stay


def test_of_two_stop_strings_ending_on_the_same_token_the_one_that_begins_first_cuts() -> None:
    text_generation = generation(stop=("cd", "bcd"))
    chunks = streamed(text_generation, ids("abcde"))
    assert text_generation.final_text == "a" and "".join(text for text, _ in chunks) == "a"


def test_what_is_held_back_for_one_stop_string_can_make_another_hold_back_more() -> None:
    # "a" may begin "ab"; with it held, "yx" before it may begin "yxz": all three wait
    chunks = streamed(generation(stop=("ab", "yxz")), ids("cyxa"))
    assert chunks == [("c", [ord("c")]), ("", [ord("y")]), ("", [ord("x")]), ("", [ord("a")])]


def test_max_tokens_ends_it_with_length_and_a_stop_token_counts_but_is_not_kept() -> None:
    capped = generation(max_tokens=3)
    streamed(capped, ids("abcdef"))
    assert (capped.finish_reason, capped.text(), capped.completion_tokens) == (FinishReason.LENGTH, "abc", 3)
    stopped = generation()
    streamed(stopped, [*ids("ab"), EOS_ID, *ids("cd")])
    assert (stopped.text(), stopped.token_ids, stopped.completion_tokens) == ("ab", ids("ab"), 3)


def test_stop_when_reads_the_text_so_far_after_each_token() -> None:
    seen: list[str] = []

    def stop_when(text: str) -> bool:
        seen.append(text)
        return text.endswith(".")

    text_generation = generation(stop_when=stop_when)
    streamed(text_generation, ids("Hé. More"))
    assert seen == ["H", "H", "Hé", "Hé."] and text_generation.text() == "Hé."


def test_forced_tokens_count_as_streamed_up_to_what_was_safe_to_stream() -> None:
    text_generation = generation(stop=("xyz",))
    for token in ids("abx"):
        text_generation.force(token)
    assert text_generation.sent_text == "ab" and text_generation.chunk() is None
    text_generation.add(ord("q"))
    chunk = text_generation.chunk()
    assert chunk is not None and (chunk.text, chunk.token_ids) == ("xq", [ord("q")])


def test_a_tokenizer_that_cleans_up_spaces_or_has_no_backend_gets_no_stream_decoder() -> None:
    assert stream_decoder_factory(TOKENIZER) is not None
    cleaning = byte_tokenizer()
    cleaning.clean_up_tokenization_spaces = True  # decode() then rewrites " ." as "."; a stream could not
    assert stream_decoder_factory(cleaning) is None
    assert stream_decoder_factory(object()) is None


def test_a_whole_decoder_gives_only_text_that_extends_what_it_gave() -> None:
    answers = {1: "a", 2: "XY", 3: "ab\ufffd", 4: "abc"}
    decoder = WholeDecoder(lambda token_ids: answers[len(token_ids)])
    assert [decoder.step(t) for t in range(4)] == ["a", "", "b", "c"]
    assert decoder.whole() == "abc"


# --- the reference: every token so far decoded on each step ------------------------------


class Reference:
    """The rules as the HF path (ArRequest) and the vLLM path (_Answer) had them, each on the
    whole text decoded again after every token."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.token_ids: list[int] = []
        self.completion_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.final_text: str | None = None
        self.sent_text = ""
        self.sent_tokens = 0

    def add(self, token: int) -> None:
        self.completion_tokens += 1
        if token == EOS_ID:
            self.finish_reason = FinishReason.STOP
            return
        self.token_ids.append(token)
        if self.params.stop:
            text, hit = cut_at_stop(decode(self.token_ids), self.params.stop)
            if hit:
                self.finish_reason, self.final_text = FinishReason.STOP, text
                return
        if self.completion_tokens >= self.params.max_tokens:
            self.finish_reason = FinishReason.LENGTH

    def text(self) -> str:
        if self.final_text is not None:
            return self.final_text
        full = decode(self.token_ids)
        return full if self.finish_reason is not None else streamable_prefix(full, self.params.stop)

    def chunk(self) -> tuple[str, list[int]] | None:
        text = self.text()
        delta = text[len(self.sent_text) :] if text.startswith(self.sent_text) else ""
        token_ids = self.token_ids[self.sent_tokens :]
        if not token_ids and not delta:
            return None
        self.sent_tokens, self.sent_text = len(self.token_ids), self.sent_text + delta
        return delta, token_ids


# Text with characters of one to four bytes, and stop strings made of the same characters.
_CHARS = st.sampled_from(list("ab .,\n") + ["é", "日", "😀"])


@settings(max_examples=120, deadline=None)
@given(
    text=st.text(_CHARS, max_size=30),
    stops=st.lists(st.text(_CHARS, min_size=1, max_size=4), max_size=3),
    max_tokens=st.integers(1, 120),
    every=st.integers(1, 4),
    eos_at=st.one_of(st.none(), st.integers(0, 120)),
)
def test_it_streams_and_ends_exactly_as_decoding_every_token_each_step_did(
    text: str, stops: list[str], max_tokens: int, every: int, eos_at: int | None
) -> None:
    tokens = ids(text)
    if eos_at is not None:
        tokens.insert(min(eos_at, len(tokens)), EOS_ID)
    params = SamplingParams(max_tokens=max_tokens, stop=tuple(stops))
    ours = TextGeneration(params, StreamDecoder(BACKEND), {EOS_ID})
    reference = Reference(params)
    for step, token in enumerate(tokens, 1):
        ours.add(token)
        reference.add(token)
        assert ours.finish_reason is reference.finish_reason
        if ours.finish_reason is not None or step % every == 0:
            chunk = ours.chunk()
            assert (None if chunk is None else (chunk.text, chunk.token_ids)) == reference.chunk()
        if ours.finish_reason is not None:
            break
    assert (ours.text(), ours.token_ids, ours.completion_tokens) == (
        reference.text(),
        reference.token_ids,
        reference.completion_tokens,
    )


def test_the_tiny_models_tokenizer_streams_through_its_backend() -> None:
    factory = stream_decoder_factory(tiny_tokenizer())
    assert factory is not None
    decoder = factory()
    assert "".join(decoder.step(ord(c) - 32) for c in "Hi there.") == "Hi there."

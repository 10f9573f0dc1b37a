"""Where a sentence ends (:mod:`omnictl.models.voice_assistant.sentences`): the one rule the
thinker's sentence cap and the TTS splitter share, the counter the cap reads as the answer
grows, and the cap itself on the HF runner (the vLLM thinker's is in
tests/schedulers/test_vllm_engine_unit.py)."""

from __future__ import annotations

import re

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnictl.models.tiny_causal_lm import EOS_ID, tiny_llama, tiny_tokenizer
from omnictl.models.voice_assistant.answer_runner import SpokenAnswerRunner
from omnictl.models.voice_assistant.sentences import SentenceCounter, dot_continues, sentences_ended
from omnictl.models.voice_assistant.tts import SentenceSplitter

DARCY = "Mr. Darcy is rich. He lives in Derbyshire."


def test_an_abbreviation_initial_or_list_number_does_not_end_a_sentence() -> None:
    assert sentences_ended(DARCY) == 2
    assert sentences_ended("Mr.") == 0 and sentences_ended("Ask Dr. Smith, e.g. today") == 0
    assert sentences_ended("J. R. R. Tolkien wrote it.") == 1
    assert dot_continues("see (Prof") and dot_continues("step 1") and dot_continues("")
    assert not dot_continues("Paris") and not dot_continues("a" * 40 + " Paris")


def test_the_cap_and_the_splitter_end_a_sentence_at_the_same_dots() -> None:
    splitter = SentenceSplitter(first_clause_chars=None, first_max_chars=None)
    pieces = [piece for word in DARCY.split(" ") for piece in splitter.feed(word + " ")]
    assert pieces == ["Mr. Darcy is rich.", "He lives in Derbyshire."]
    counts = [sentences_ended(DARCY[: len(DARCY) - len(rest)]) for rest in ("He lives in Derbyshire.", "")]
    assert counts == [1, 2]


# The cap's rule before abbreviations were known to it: what the counter keeps for text without them.
_PLAIN_END = re.compile(r"(?:(?<=[^\W\d_])[.!?]|[!?])[\"'”’)\]]*(?=\s|$)|\n")
_WORDS = st.sampled_from(["Paris", "is", "big", "3.14", "ok", "Yes!", "why?", "end.", "\"so.\"", "(it)."])
_SPACES = st.sampled_from([" ", "  ", "\n", " \n\n", "\t"])


@settings(max_examples=120, deadline=None)
@given(
    words=st.lists(st.tuples(_WORDS, _SPACES), max_size=12),
    lead=_SPACES,
    tail=st.sampled_from(["", ".", "Rome", "Rome."]),
    cuts=st.lists(st.integers(0, 200), max_size=8),
)
def test_fed_in_any_pieces_it_counts_what_the_whole_text_has(
    words: list[tuple[str, str]], lead: str, tail: str, cuts: list[int]
) -> None:
    text = lead + "".join(word + space for word, space in words) + tail
    counter = SentenceCounter()
    bounds = sorted({0, len(text), *(cut for cut in cuts if cut < len(text))})
    counts = [counter.feed(text[start:end]) for start, end in zip(bounds, bounds[1:])]
    assert (counts[-1] if counts else 0) == sentences_ended(text)
    assert sentences_ended(text) == len(_PLAIN_END.findall(text.lstrip()))  # no abbreviation: as before
    for end, count in zip(bounds[1:], counts):
        assert count == sentences_ended(text[:end])


def test_the_hf_runner_caps_the_answer_after_mr_darcys_whole_sentence() -> None:
    """The cap forces end-of-answer once the answer has said max_sentences sentences; the
    first is "Mr. Darcy is rich.", not "Mr."."""
    tokenizer = tiny_tokenizer()
    runner = SpokenAnswerRunner(tiny_llama(), tokenizer, max_sentences=1)
    runner.prefill("r", {"input_ids": tokenizer("Who is rich?", add_special_tokens=False)["input_ids"]})
    answer = tokenizer(DARCY, add_special_tokens=False)["input_ids"]
    capped_after = None
    for count, token in enumerate(answer, 1):
        (output,) = runner.decode(["r"], [token])
        only_eos = bool(torch.isinf(output.logits).sum() == output.logits.numel() - 1) and output.logits[EOS_ID] == 0
        if only_eos:
            capped_after = count
            break
    runner.release("r")
    assert capped_after is not None and tokenizer.decode(answer[:capped_after]) == "Mr. Darcy is rich."

"""transformers' Moshi on the tiny checkpoint (tests/models/conftest.py's, written once per session),
and its own check of a session's frames."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from tests.models.conftest import one_thread
from tests.models.mimi.conftest import speechlike  # noqa: F401  (for the modules here)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """torch on one thread in this process, as each stage process runs (tests/models/conftest.py)."""
    with one_thread():
        yield


@pytest.fixture(scope="session")
def moshi_model(tiny_moshi: Path) -> Any:
    """transformers' ``MoshiForConditionalGeneration`` on the tiny checkpoint (eval), loaded
    once for the session: the reference every module here checks against (read only)."""
    from transformers import MoshiForConditionalGeneration

    return MoshiForConditionalGeneration.from_pretrained(tiny_moshi).eval()


def user_codes(model: Any, audio: Any) -> torch.Tensor:
    """transformers' one-shot Mimi encode of the whole input: ``[frames, codebooks]``."""
    with torch.inference_mode():
        audio = torch.as_tensor(audio, dtype=torch.float32).reshape(1, 1, -1)
        codes = model.audio_encoder.encode(audio, num_quantizers=model.config.num_codebooks).audio_codes
    return codes[0].T


def delayed(frames: torch.Tensor, start: int) -> torch.Tensor:
    """Frames ``[F, K]`` laid out as transformers' Moshi reads them (``build_delay_pattern_mask``):
    ``[K, F + 1]`` positions, position 0 the unconditional start, codebook 0 of frame ``f`` at
    ``f + 1`` and codebooks 1.. at ``f + 2`` (the last frame's are past the end)."""
    count, k = frames.shape
    out = torch.full((k, count + 1), start, dtype=torch.long)
    out[0, 1:] = frames[:, 0]
    out[1:, 2:] = frames[:-1, 1:].T
    return out


def greedy_mismatches(model: Any, user: torch.Tensor, result: dict[str, Any]) -> list[str]:
    """Where a session's output is not what transformers' greedy Moshi makes of ``user``.

    One forward of ``MoshiForConditionalGeneration`` over the whole session, teacher-forced
    with the session's own text tokens and frames (and the user's codes), and one batched
    forward of its depth decoder: greedy decoding made every token and code the argmax given
    the ones before, so the output is transformers' greedy output exactly when each argmax
    here is the token or code the session made (by induction, frame by frame). Empty: equal."""
    frames = torch.as_tensor(result["codes"], dtype=torch.long)
    tokens = list(result["text_tokens"])
    flight = result["in_flight"]
    count, k = frames.shape
    config = model.config
    vocab, start = int(config.vocab_size), int(config.audio_vocab_size)
    assert user.shape[0] >= count and len(tokens) == count
    with torch.inference_mode():
        out = model(
            input_ids=torch.tensor([[vocab, *tokens]]),
            user_audio_codes=delayed(user[:count], start)[None],
            moshi_audio_codes=delayed(frames, start)[None],
            use_cache=False,
        )
        text = out.logits[0].argmax(-1)  # position j scores the token of j + 1
        hidden = out.last_hidden_state[0]  # [count + 1, hidden]
        # Row j: what the depth decoder made at position j + 1, teacher-forced.
        made = torch.full((count + 1, k), -1, dtype=torch.long)
        made[:, 0] = torch.cat([frames[:, 0], torch.as_tensor(flight["codes"])[:1]])
        made[1:, 1:] = frames[:, 1:]
        everything = [*tokens, int(flight["token"])]
        ids = torch.cat([torch.tensor(everything)[:, None], made[:, :-1].clamp(min=0)], dim=1)
        depth = model.depth_decoder(
            input_ids=ids, last_hidden_state=hidden[:, None], attention_mask=torch.ones_like(ids), use_cache=False
        )
        codes = depth.logits.argmax(-1)  # [count + 1, k]
    wrong = [f"text token of frame {f}: {tokens[f]} != {int(text[f])}" for f in range(count) if text[f] != tokens[f]]
    if int(text[count]) != int(flight["token"]):
        wrong.append(f"the text token in flight: {flight['token']} != {int(text[count])}")
    for j in range(count + 1):
        # position 1's codebooks 1.. are the start code whatever the depth decoder says there
        for c in range(k if j > 0 else 1):
            if made[j, c] != codes[j, c]:
                wrong.append(f"position {j + 1} codebook {c}: {int(made[j, c])} != {int(codes[j, c])}")
    return wrong

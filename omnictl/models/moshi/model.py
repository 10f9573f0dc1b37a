"""Moshi's two transformers as a session steps them, frame by frame, exactly as transformers' ``generate`` does.

One Moshi step reads a whole 80 ms position ``j`` of three streams and scores the text
token of position ``j + 1``:

- the temporal transformer (``MoshiForConditionalGeneration``'s ``decoder``) sums the
  embeddings of the text token at ``j``, Moshi's own audio codes at ``j`` and the user's
  audio codes at ``j`` and steps its KV cache once (:meth:`Temporal.step`);
- the depth transformer (``depth_decoder``) makes the audio codes of position ``j + 1``
  from that step's hidden state and the text token just chosen, one codebook at a time
  (:meth:`Depth.codes`).

The audio streams are *delayed* as transformers lays them out
(``build_delay_pattern_mask``): codebook 0 of frame ``f`` sits at position ``f + 1``,
codebooks 1.. at ``f + 2``; position 0 is the unconditional start (the text token
``vocab_size``, every audio code ``audio_vocab_size``), and the codebooks 1.. of position
1 are that start code too, whatever the depth transformer said. So the user's frame
``f`` enters at positions ``f + 1`` and ``f + 2``, and Moshi's frame ``f`` is whole once
the depth transformer has made position ``f + 2``: one user frame in, one Moshi frame out.
``tests/models/moshi`` checks a session stepped this way against ``generate`` (its user
stream is silence after a prompt) and the served pipeline against it on 8 s of speech-like input streamed at real time.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnictl.schedulers.sampling import Sampler

_lock = threading.Lock()


def load_moshi(model_path: str | Path | None, device: str | None = None) -> Any:
    """``MoshiForConditionalGeneration`` from a local checkpoint, float32, eval mode, without its
    Mimi (the codec stages load their own); one per checkpoint and device in a process."""
    if model_path is None:
        raise ValueError("factory_args.model_path: Moshi needs a local checkpoint (serve --model PATH)")
    root = Path(model_path)
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"{root / 'config.json'}: no config.json (model_path must be a local Moshi checkpoint)")
    with _lock:
        return _load(str(root.resolve()), device or "cpu")


@functools.lru_cache(maxsize=4)
def _load(root: str, device: str) -> Any:
    from transformers import MoshiForConditionalGeneration

    model: Any = MoshiForConditionalGeneration.from_pretrained(
        root, dtype=torch.float32
    )  # Any: .to() is typed for its wrapper
    if model.config.model_type != "moshi":
        raise ValueError(f"{root}: model_type {model.config.model_type!r} is not a Moshi checkpoint")
    model.audio_encoder = None  # the Mimi stages hold the codec
    return model.to(torch.device(device)).eval()


@dataclass(slots=True)
class Session:
    """One session's temporal state: its KV cache and the position it steps next."""

    cache: Any
    position: int = 0  # the position the next step reads
    user: torch.Tensor | None = None  # the user's previous frame (its codebooks 1.. enter one position late)
    tokens: list[int] = field(default_factory=list)  # text tokens chosen, for positions 1, 2, ...


@dataclass(frozen=True, slots=True)
class Step:
    """What a temporal step made: the text token of ``position`` and the hidden state the depth
    transformer makes that position's audio codes from."""

    position: int
    token: int
    hidden: torch.Tensor  # [hidden_size]


class Temporal:
    """The temporal transformer of a Moshi checkpoint."""

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        self.model = load_moshi(model_path, device)
        config = self.model.config
        self.device = next(self.model.decoder.parameters()).device
        self.codebooks = int(config.num_codebooks)
        self.start_token = int(config.vocab_size)  # the unconditional start's text token
        self.start_code = int(config.audio_vocab_size)  # and its audio code (also a delayed stream's filler)

    def open(self) -> Session:
        from transformers import DynamicCache

        return Session(cache=DynamicCache(config=self.model.config))

    @torch.inference_mode()
    def step(self, session: Session, sampler: Sampler, moshi: torch.Tensor | None, user: torch.Tensor | None) -> Step:
        """Step position ``session.position``: the start (``moshi`` and ``user`` None) at 0; then
        ``moshi`` the depth transformer's codes for that position and ``user`` the user's frame
        whose codebook 0 enters there (``[codebooks]`` each)."""
        k, j = self.codebooks, session.position
        if j == 0:
            token = self.start_token
            moshi_codes = user_codes = torch.full((k,), self.start_code, dtype=torch.long)
        else:
            if moshi is None or user is None:
                raise ValueError(f"Moshi position {j} needs Moshi's codes and the user's frame")
            token = session.tokens[-1]
            moshi_codes = torch.as_tensor(moshi, dtype=torch.long).reshape(k)
            user = torch.as_tensor(user, dtype=torch.long).reshape(k)
            previous = session.user
            late = previous[1:] if previous is not None else torch.full((k - 1,), self.start_code, dtype=torch.long)
            user_codes = torch.cat([user[:1], late])
            session.user = user
        out = self.model(
            input_ids=torch.tensor([[token]], device=self.device),
            user_audio_codes=user_codes.reshape(1, k, 1).to(self.device),
            moshi_audio_codes=moshi_codes.reshape(1, k, 1).to(self.device),
            cache=session.cache,
            use_cache=True,
        )
        chosen = sampler.sample(out.logits[0, -1].float())
        session.tokens.append(chosen)
        session.position = j + 1
        return Step(position=j + 1, token=chosen, hidden=out.last_hidden_state[0, -1].clone())


class Depth:
    """The depth transformer of a Moshi checkpoint: a position's audio codes from a temporal step."""

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        model = load_moshi(model_path, device)
        self.depth = model.depth_decoder
        self.device = next(self.depth.parameters()).device
        self.codebooks = int(model.config.num_codebooks)
        self.start_code = int(model.config.audio_vocab_size)

    @torch.inference_mode()
    def codes(self, step: Step, sampler: Sampler) -> torch.Tensor:
        """The audio codes ``[codebooks]`` (int64, CPU) of ``step.position``, as Moshi reads them
        back (position 1's codebooks 1.. are the start code: the delayed streams begin there)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.depth.config)
        hidden = step.hidden.reshape(1, 1, -1).to(self.device)
        ids = torch.tensor([[step.token]], device=self.device)
        codes: list[int] = []
        for _ in range(self.codebooks):
            out = self.depth(input_ids=ids, last_hidden_state=hidden, cache=cache, use_cache=True)
            code = sampler.sample(out.logits[0, -1].float())
            codes.append(code)
            ids = torch.tensor([[code]], device=self.device)
        made = torch.tensor(codes, dtype=torch.long)
        if step.position == 1:
            made[1:] = self.start_code
        return made

"""The talker's prompt for one request, built as ``Qwen3OmniMoeForConditionalGeneration.generate`` does.

User turns: text positions are the thinker's input embeddings through the talker's
``text_projection``; media positions are the thinker's hidden states (at
``accept_hidden_layer``) through ``hidden_projection``. Then the assistant header,
four ``tts_pad``, ``tts_bos`` and the thinker's first token, each added to a codec
control embedding (no-think markers, speaker, codec pad/bos).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch


@dataclass(slots=True)
class TalkerPrompt:
    embeds: torch.Tensor  # [1, length, talker hidden]
    position_ids: torch.Tensor  # [4, 1, length]: text row, then the 3-D mrope rows
    rope_delta: int
    tts_eos: torch.Tensor  # [1, 1, talker hidden]
    tts_pad: torch.Tensor
    talker: Any
    thinker_embed: Any

    @property
    def length(self) -> int:
        return int(self.embeds.shape[1])

    def text_step(self, item: int | str) -> torch.Tensor:
        """The text part of one decode step's input: a thinker token, "eos" or "pad"."""
        if item == "eos":
            return self.tts_eos
        if item == "pad":
            return self.tts_pad
        token = torch.tensor([[item]], dtype=torch.long, device=self.embeds.device)
        return self.talker.text_projection(self.thinker_embed(token))


def _user_mask(ids: torch.Tensor, im_start: int, user: int) -> torch.Tensor:
    """Positions inside user turns: the token after their last <|im_start|> is the user role."""
    positions = torch.arange(ids.shape[0], device=ids.device)
    starts = torch.where(ids == im_start, positions, positions.new_full((), -1))
    previous_start = torch.cummax(starts, dim=0).values.clamp_min(0)
    role = ids[(previous_start + 1).clamp_max(ids.shape[0] - 1)]
    return role == user


def _assistant_start(ids: torch.Tensor, im_start: int, assistant: int) -> int:
    starts = torch.nonzero((ids[:-1] == im_start) & (ids[1:] == assistant)).flatten()
    if starts.numel() == 0:
        raise ValueError("talker: the prompt has no assistant turn header (<|im_start|>assistant)")
    start = int(starts[-1])
    if ids.shape[0] - start != 3:
        raise ValueError("talker: the prompt must end with the assistant header '<|im_start|>assistant\\n'")
    return start


def build_talker_prompt(
    config: Any, talker: Any, thinker_embed: Any, prefix: Mapping[str, Any], first_token: int | None
) -> TalkerPrompt:
    """``first_token``: the thinker's first token when spoken, None when the answer is empty."""
    talker_config = config.talker_config
    device = talker.device
    ids = prefix["prompt_ids"].to(device)
    hidden_size = talker_config.text_config.hidden_size
    mm_ids = torch.tensor(
        [
            config.thinker_config.audio_token_id,
            config.thinker_config.image_token_id,
            config.thinker_config.video_token_id,
        ],
        device=device,
    )
    multimodal = torch.isin(ids, mm_ids)
    user_part = torch.empty(ids.shape[0], hidden_size, device=device, dtype=talker.dtype)
    if multimodal.any():
        user_part[multimodal] = talker.hidden_projection(prefix["mm_hidden"].to(device, talker.dtype))
    user_part[~multimodal] = talker.text_projection(thinker_embed(ids[None])[0][~multimodal])
    user = _user_mask(ids, config.im_start_token_id, config.user_token_id)

    special = torch.tensor([[config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]], device=device)
    tts_bos, tts_eos, tts_pad = talker.text_projection(thinker_embed(special)).chunk(3, dim=1)

    start = _assistant_start(ids, config.im_start_token_id, config.assistant_token_id)
    header_ids = ids[start:]
    if first_token is not None:
        header_ids = torch.cat([header_ids, torch.tensor([first_token], device=device)])
    header = talker.text_projection(thinker_embed(header_ids[None]))
    assistant_text = torch.cat([header[:, :3], tts_pad.expand(1, 4, -1), tts_bos, header[:, 3:4]], dim=1)
    speaker = _speaker_id(talker_config, prefix.get("voice"))
    codec_ids = torch.tensor(
        [
            [
                talker_config.codec_nothink_id,
                talker_config.codec_think_bos_id,
                talker_config.codec_think_eos_id,
                speaker,
                talker_config.codec_pad_id,
                talker_config.codec_bos_id,
            ]
        ],
        device=device,
    )
    assistant_codec = torch.cat(
        [torch.zeros(1, 3, hidden_size, device=device, dtype=talker.dtype), talker.get_input_embeddings()(codec_ids)],
        dim=1,
    )
    embeds = torch.cat([user_part[user][None], assistant_text + assistant_codec], dim=1)
    talker_ids = torch.cat(
        [ids[user], torch.full((assistant_text.shape[1],), config.tts_pad_token_id, device=device, dtype=ids.dtype)]
    )
    position_ids, rope_delta = _positions(talker, talker_ids, prefix)
    return TalkerPrompt(embeds, position_ids, rope_delta, tts_eos, tts_pad, talker, thinker_embed)


def _speaker_id(talker_config: Any, voice: str | None) -> int:
    speakers = talker_config.speaker_id or {}
    if not speakers:
        raise ValueError("talker: the checkpoint's talker_config.speaker_id lists no speakers")
    default = "ethan" if "ethan" in speakers else next(iter(speakers))  # transformers' default speaker
    name = (voice or default).lower()
    if name not in speakers:
        raise ValueError(f"talker: unknown voice {voice!r}; this checkpoint has {sorted(speakers)}")
    return int(speakers[name])


def _positions(talker: Any, talker_ids: torch.Tensor, prefix: Mapping[str, Any]) -> tuple[torch.Tensor, int]:
    length = talker_ids.shape[0]
    device = talker_ids.device
    text = torch.arange(length, device=device).view(1, 1, -1)
    grid = prefix.get("image_grid_thw")
    audio_lengths = prefix.get("audio_feature_lengths")
    if audio_lengths is None and (grid is None or grid.numel() == 0):
        return torch.cat([text, text.expand(3, -1, -1)]), 0
    mrope, delta = talker.get_rope_index(
        talker_ids[None],
        grid.to(device) if grid is not None else None,
        None,
        torch.ones(1, length, dtype=torch.long, device=device),
        False,
        audio_lengths.to(device) if audio_lengths is not None else None,
        None,
    )
    return torch.cat([text, mrope.to(text.dtype)]), int(delta.reshape(-1)[0])

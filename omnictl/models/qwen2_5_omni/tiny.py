"""Write a random-weight Qwen2.5-Omni checkpoint for tests and benchmarks.

The checkpoint has the real architecture (thinker with audio and vision towers, talker,
token2wav: a DiT turning codes into a mel spectrogram by an ODE from noise, and a BigVGAN
vocoder) plus a real processor: the byte-level BPE tokenizer Qwen3-Omni's writer trains
here (with two speaker tokens added), a Whisper feature extractor and a Qwen2-VL image
processor, and the speakers' ``spk_dict.pt`` that ``Qwen2_5OmniForConditionalGeneration``
loads. Nothing is downloaded. Two sizes (:data:`SIZES`):

- ``tiny``: width 32, two layers everywhere; the whole model is about a megabyte and runs
  in well under a second a request on a CPU (tests; it measures the runtime's own cost);
- ``real``: the thinker, talker, DiT and BigVGAN at the released Qwen2.5-Omni-7B widths
  and depths and its vocabulary size (for a GPU; the audio and vision towers stay tiny,
  the benchmarks send text).

Run ``python -m omnictl.models.qwen2_5_omni.tiny OUT_DIR [--size real]``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnictl.models.qwen3_omni.tiny import (
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    _build_tokenizer,
    _save_processor,
    _single_token,
)
from omnictl.models.tiny_checkpoint import random_model, writer_main

HIDDEN = 32  # the towers' width at every size
# transformers' default speaker is "Chelsie"; each speaker's text start token is its own.
SPEAKERS = ("Chelsie", "Ethan")
SPEAKER_TOKENS = tuple(f"<|spk_{name.lower()}|>" for name in SPEAKERS)


@dataclass(frozen=True)
class Widths:
    """The sizes that differ between :data:`SIZES`."""

    hidden: int  # thinker
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    mrope_section: tuple[int, int, int]  # sums to head_dim / 2
    talker_hidden: int
    talker_layers: int
    talker_heads: int
    talker_kv_heads: int
    talker_head_dim: int
    talker_intermediate: int
    codebook: int  # codec codes; the talker's vocabulary adds its specials above
    dit_hidden: int
    dit_layers: int
    dit_heads: int
    dit_head_dim: int
    dit_emb_dim: int
    dit_block: int
    mel_dim: int  # a multiple of 16: see token2wav.NoiseStream
    enc_channels: tuple[int, ...]
    enc_dim: int
    enc_emb_dim: int
    bigvgan_channels: int
    vocab: int = 0  # the thinker's vocabulary (0: the tokenizer's own)


SIZES: dict[str, Widths] = {
    "tiny": Widths(
        hidden=HIDDEN,
        layers=2,
        heads=2,
        kv_heads=2,
        intermediate=64,
        mrope_section=(4, 2, 2),
        talker_hidden=HIDDEN,
        talker_layers=2,
        talker_heads=2,
        talker_kv_heads=1,
        talker_head_dim=16,
        talker_intermediate=64,
        codebook=64,
        dit_hidden=HIDDEN,
        dit_layers=2,
        dit_heads=2,
        dit_head_dim=16,
        dit_emb_dim=16,
        dit_block=4,
        mel_dim=16,
        enc_channels=(16, 16, 16, 32),  # the last is the sum of the middle ones (ECAPA aggregates them)
        enc_dim=16,
        enc_emb_dim=16,
        bigvgan_channels=64,
    ),
    "real": Widths(
        hidden=3584,
        layers=28,
        heads=28,
        kv_heads=4,
        intermediate=18944,
        mrope_section=(16, 24, 24),
        talker_hidden=896,
        talker_layers=24,
        talker_heads=12,
        talker_kv_heads=4,
        talker_head_dim=128,
        talker_intermediate=4864,
        codebook=8192,
        dit_hidden=1024,
        dit_layers=22,
        dit_heads=16,
        dit_head_dim=64,
        dit_emb_dim=512,
        dit_block=24,
        mel_dim=80,
        enc_channels=(256, 256, 256, 256, 768),
        enc_dim=128,
        enc_emb_dim=192,
        bigvgan_channels=1536,
        vocab=152064,
    ),
}

TALKER_SPECIALS = ("pad", "start", "end", "mask")  # codec ids codebook+0.. in this order
REFERENCE_MEL_FRAMES = 30  # each speaker's reference mel spectrogram


def _build_processor(tokenizer: Any) -> Any:
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    from omnictl.models.qwen2_5_omni.processor import Qwen25OmniProcessorWithoutVideo

    feature_extractor = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400)
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=28 * 28, max_pixels=112 * 112
    )
    return Qwen25OmniProcessorWithoutVideo(
        image_processor=image_processor,
        video_processor=None,
        feature_extractor=feature_extractor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )


def build_config(tokenizer: Any, size: str = "tiny") -> Any:
    """The ``Qwen2_5OmniConfig`` of ``size`` whose special-token ids come from ``tokenizer``."""
    from transformers import Qwen2_5OmniConfig

    w = SIZES[size]
    tid = tokenizer.convert_tokens_to_ids
    head_dim = w.hidden // w.heads
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": list(w.mrope_section)}
    token_ids = {
        "audio_token_index": tid("<|audio_pad|>"),
        "image_token_index": tid("<|image_pad|>"),
        "video_token_index": tid("<|video_pad|>"),
        "audio_start_token_id": tid("<|audio_start|>"),
        "audio_end_token_id": tid("<|audio_end|>"),
        "vision_start_token_id": tid("<|vision_start|>"),  # get_rope_index reads it (the released config has it)
        "vision_end_token_id": tid("<|vision_end|>"),
    }
    vocab_size = max(len(tokenizer), w.vocab)
    thinker = {
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": HIDDEN,
            "output_dim": w.hidden,
            "n_window": 100,
            "max_source_positions": 1500,
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": HIDDEN,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,
            "out_hidden_size": w.hidden,
            "fullatt_block_indexes": [1],
        },
        "text_config": {
            "vocab_size": vocab_size,
            "hidden_size": w.hidden,
            "intermediate_size": w.intermediate,
            "num_hidden_layers": w.layers,
            "num_attention_heads": w.heads,
            "num_key_value_heads": w.kv_heads,
            "rope_parameters": rope,
            "max_position_embeddings": 4096,
        },
        "user_token_id": _single_token(tokenizer, "user"),
        **token_ids,
    }
    assert sum(w.mrope_section) * 2 == head_dim, "mrope sections cover half the thinker's head dim"
    codec = {name: w.codebook + i for i, name in enumerate(TALKER_SPECIALS)}
    talker_vocab = w.codebook + 256  # released: 8192 codes and 256 specials above them
    talker = {
        "vocab_size": talker_vocab,
        "embedding_size": w.hidden,
        "hidden_size": w.talker_hidden,
        "intermediate_size": w.talker_intermediate,
        "num_hidden_layers": w.talker_layers,
        "num_attention_heads": w.talker_heads,
        "num_key_value_heads": w.talker_kv_heads,
        "head_dim": w.talker_head_dim,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [w.talker_head_dim // 8, w.talker_head_dim * 3 // 16, w.talker_head_dim * 3 // 16],
        },
        "max_position_embeddings": 4096,
        "tts_text_start_token_id": tid("<|tts_bos|>"),
        "tts_text_end_token_id": tid("<|tts_eos|>"),
        "tts_text_pad_token_id": tid("<|tts_pad|>"),
        "tts_codec_pad_token_id": codec["pad"],
        "tts_codec_start_token_id": codec["start"],
        "tts_codec_end_token_id": codec["end"],
        "tts_codec_mask_token_id": codec["mask"],
        **token_ids,
    }
    dit = {
        "hidden_size": w.dit_hidden,
        "num_hidden_layers": w.dit_layers,
        "num_attention_heads": w.dit_heads,
        "head_dim": w.dit_head_dim,
        "ff_mult": 2,
        "emb_dim": w.dit_emb_dim,
        "block_size": w.dit_block,
        "look_ahead_layers": [w.dit_layers // 2],
        "look_backward_layers": [0, w.dit_layers - 1],
        "repeats": 2,
        # Every talker id embeds (the released DiT has 8193: the codes and one more), so a
        # random talker's special ids are still a valid input.
        "num_embeds": talker_vocab,
        "mel_dim": w.mel_dim,
        "enc_emb_dim": w.enc_emb_dim,
        "enc_dim": w.enc_dim,
        "enc_channels": list(w.enc_channels),
        "enc_kernel_sizes": [5] + [3] * (len(w.enc_channels) - 2) + [1],
        "enc_dilations": list(range(1, len(w.enc_channels))) + [1],
        "enc_attention_channels": max(8, w.enc_channels[0] // 4),
        "enc_res2net_scale": 2,
        "enc_se_channels": max(8, w.enc_channels[0] // 4),
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": 32768,
    }
    bigvgan = {
        "mel_dim": w.mel_dim,
        "upsample_initial_channel": w.bigvgan_channels,
        "resblock_kernel_sizes": [3, 7, 11] if size == "real" else [3],
        "resblock_dilation_sizes": [[1, 3, 5]] * (3 if size == "real" else 1),
        "upsample_rates": [5, 3, 2, 2, 2, 2],  # 240 samples a mel frame at 24 kHz
        "upsample_kernel_sizes": [11, 7, 4, 4, 4, 4],
    }
    return Qwen2_5OmniConfig(
        thinker_config=thinker,
        talker_config=talker,
        token2wav_config={"dit_config": dit, "bigvgan_config": bigvgan},
    )


def write_speakers(out: Path, tokenizer: Any, config: Any, seed: int) -> None:
    """``spk_dict.pt``: per speaker its text start token, DiT conditioning and reference mel."""
    import torch

    dit = config.token2wav_config.dit_config
    generator = torch.Generator().manual_seed(seed + 1)
    speakers = {}
    for name, token in zip(SPEAKERS, SPEAKER_TOKENS):
        speakers[name] = {
            "bos_token": int(tokenizer.convert_tokens_to_ids(token)),
            "cond": torch.randn(1, dit.enc_emb_dim, generator=generator),
            "ref_mel": torch.randn(1, REFERENCE_MEL_FRAMES, dit.mel_dim, generator=generator),
        }
    torch.save(speakers, out / "spk_dict.pt")


def write_tiny_checkpoint(out_dir: str | Path, seed: int = 0, size: str = "tiny", device: str = "cpu") -> Path:
    """Config, random weights (seeded), tokenizer, processor and speaker files into ``out_dir``;
    ``real`` is stored in bfloat16 (stages load float32)."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(SPECIAL_TOKENS + SPEAKER_TOKENS)
    config = build_config(tokenizer, size)
    model = random_model(Qwen2_5OmniForConditionalGeneration, config, seed=seed, device=device, bfloat16=size != "tiny")
    model.save_pretrained(out)
    _save_processor(_build_processor(tokenizer), out)
    write_speakers(out, tokenizer, config, seed)
    return out


def main(argv: list[str] | None = None) -> int:
    return writer_main(argv, doc=__doc__, sizes=SIZES, write=write_tiny_checkpoint, name="Qwen2.5-Omni")


if __name__ == "__main__":
    sys.exit(main())

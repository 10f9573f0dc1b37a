"""Write a random-weight Qwen3-Omni checkpoint for tests and benchmarks.

The checkpoint has the real architecture (thinker with audio and vision towers,
talker with its code predictor, code2wav vocoder) plus a real processor: a byte-level
BPE tokenizer trained here on a few sentences, a Whisper feature extractor and a
Qwen2-VL image processor. Nothing is downloaded. Four sizes (:data:`SIZES`):

- ``tiny``: hidden size 32, two layers; builds and runs in well under a second on a
  CPU (tests), so it measures the runtime's own cost and nothing else;
- ``tiny_vllm``: ``tiny`` with head size 32, the smallest vLLM's CPU attention runs
  (the tests of the thinker on vLLM);
- ``mid``: widths and depths where one thinker decode step costs several milliseconds
  on a 2-core CPU, so compute dominates (``benchmarks/qwen3_omni_open_loop.py``);
- ``real``: the thinker, talker, code predictor and vocoder at the released
  Qwen3-Omni-30B-A3B widths and depths, and its vocabulary size (for a GPU). Each MoE
  layer has 16 experts instead of 128, with the released 8 (thinker) and 6 (talker)
  active per token: a token's compute is the released model's, its weights fit a
  quarter of the memory and are written in minutes.

The audio and vision towers stay tiny at every size: the benchmarks send text, which
never reaches them.

Run ``python -m omnictl.models.qwen3_omni.tiny OUT_DIR [--size mid]``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omnictl.models.tiny_checkpoint import qwen2_tokenizer, random_model, train_byte_level_bpe, writer_main

HIDDEN = 32  # the towers' width at every size
SPEAKER = "ethan"


@dataclass(frozen=True)
class Widths:
    """The sizes that differ between :data:`SIZES` (all else is shared)."""

    hidden: int  # thinker
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    experts_per_token: int
    moe_intermediate: int
    mrope_section: tuple[int, int, int]  # sums to head_dim / 2
    talker_hidden: int
    talker_layers: int
    talker_heads: int
    talker_kv_heads: int
    talker_experts_per_token: int
    talker_moe_intermediate: int
    talker_shared_intermediate: int
    accept_hidden_layer: int  # the thinker layer whose hidden states the talker reads
    predictor_layers: int
    predictor_intermediate: int
    code_groups: int
    codebook: int  # code2wav codebook; the talker's own vocabulary adds 1024 suppressed specials on top
    vocoder_hidden: int
    vocoder_layers: int
    vocoder_heads: int
    vocoder_intermediate: int
    vocoder_window: int
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    decoder_dim: int
    vocab: int = 0  # the thinker's vocabulary (0: the tokenizer's own; larger pads the embedding and lm_head)


SIZES: dict[str, Widths] = {
    "tiny": Widths(
        hidden=HIDDEN,
        layers=2,
        heads=2,
        kv_heads=2,  # two: the thinker splits over two tensor-parallel ranks (tests/models/qwen3_omni)
        head_dim=16,
        experts=4,
        experts_per_token=2,
        moe_intermediate=16,
        mrope_section=(4, 2, 2),
        talker_hidden=HIDDEN,
        talker_layers=2,
        talker_heads=2,
        talker_kv_heads=1,
        talker_experts_per_token=2,
        talker_moe_intermediate=16,
        talker_shared_intermediate=32,
        accept_hidden_layer=1,
        predictor_layers=1,
        predictor_intermediate=64,
        code_groups=4,
        codebook=64,
        vocoder_hidden=HIDDEN,
        vocoder_layers=1,
        vocoder_heads=2,
        vocoder_intermediate=64,
        vocoder_window=8,
        upsample_rates=(4, 4),
        upsampling_ratios=(2,),
        decoder_dim=32,
    ),
    "mid": Widths(
        hidden=512,
        layers=8,
        heads=8,
        kv_heads=2,
        head_dim=64,
        experts=16,
        experts_per_token=4,
        moe_intermediate=256,
        mrope_section=(12, 10, 10),
        talker_hidden=256,
        talker_layers=4,
        talker_heads=4,
        talker_kv_heads=2,
        talker_experts_per_token=2,
        talker_moe_intermediate=128,
        talker_shared_intermediate=256,
        accept_hidden_layer=4,
        predictor_layers=2,
        predictor_intermediate=512,
        code_groups=8,
        codebook=256,
        vocoder_hidden=256,
        vocoder_layers=2,
        vocoder_heads=4,
        vocoder_intermediate=512,
        vocoder_window=16,
        upsample_rates=(8, 5, 4, 3),
        upsampling_ratios=(2, 2),
        decoder_dim=128,
    ),
    "real": Widths(
        hidden=2048,
        layers=48,
        heads=32,
        kv_heads=4,
        head_dim=128,
        experts=16,
        experts_per_token=8,
        moe_intermediate=768,
        mrope_section=(24, 20, 20),
        talker_hidden=1024,
        talker_layers=20,
        talker_heads=16,
        talker_kv_heads=2,
        talker_experts_per_token=6,
        talker_moe_intermediate=384,
        talker_shared_intermediate=768,
        accept_hidden_layer=24,
        predictor_layers=5,
        predictor_intermediate=3072,
        code_groups=16,
        codebook=2048,
        vocoder_hidden=1024,
        vocoder_layers=8,
        vocoder_heads=16,
        vocoder_intermediate=3072,
        vocoder_window=72,
        upsample_rates=(8, 5, 4, 3),
        upsampling_ratios=(2, 2),
        decoder_dim=1536,
        vocab=152064,
    ),
}

# vLLM's CPU attention takes head sizes from 32 up (vllm/v1/attention/backends/cpu_attn.py,
# get_supported_head_sizes); "tiny" keeps 16, on which the HF tests' random outputs rest.
SIZES["tiny_vllm"] = replace(SIZES["tiny"], head_dim=32, mrope_section=(8, 4, 4))

# Special tokens the chat template and the processor need, in the order they get ids.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|tts_pad|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
)

# Role names must be single tokens: the talker finds user turns by the token after <|im_start|>.
_CORPUS = (
    "system\nuser\nassistant\n" * 30,
    "You are a helpful assistant. What is the capital of France? Paris is the capital of France.\n",
    "Describe this image. Listen to this audio and answer the question. Hello, how are you today?\n",
    "The quick brown fox jumps over the lazy dog. 0123456789 yes no maybe thanks goodbye.\n",
)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('audio', 'input_audio') -%}{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif part['type'] in ('image', 'image_url') -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _build_tokenizer(special_tokens: tuple[str, ...] = SPECIAL_TOKENS) -> Any:
    """The byte-level BPE trained on :data:`_CORPUS` with ``special_tokens`` (shared with
    the Qwen2.5-Omni writer, which adds its speakers' text start tokens)."""
    bpe = train_byte_level_bpe(_CORPUS, special_tokens, vocab_size=512)
    return qwen2_tokenizer(
        bpe,
        special_tokens=special_tokens,
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "audio_token": "<|audio_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
        },
        chat_template=CHAT_TEMPLATE,
    )


def _single_token(tokenizer: Any, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise RuntimeError(f"tiny tokenizer: {text!r} must be one token, got {ids}")
    return int(ids[0])


def _build_processor(tokenizer: Any) -> Any:
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    from omnictl.models.qwen3_omni.processor import Qwen3OmniProcessorWithoutVideo

    feature_extractor = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400)
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=32 * 32, max_pixels=128 * 128
    )
    return Qwen3OmniProcessorWithoutVideo(
        image_processor=image_processor,
        video_processor=None,
        feature_extractor=feature_extractor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )


def _save_processor(processor: Any, out: Path) -> None:
    """Save like the released checkpoints do: one preprocessor_config.json for audio and images.

    (``processor.save_pretrained`` insists on a video processor, which needs torchvision.)
    """
    processor.tokenizer.save_pretrained(out)
    merged = {**processor.image_processor.to_dict(), **processor.feature_extractor.to_dict()}
    merged["feature_extractor_type"] = type(processor.feature_extractor).__name__
    merged["image_processor_type"] = "Qwen2VLImageProcessor"
    (out / "preprocessor_config.json").write_text(json.dumps(merged, indent=2, default=_json_default))


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


# The talker's rotary embedding is the thinker's class and reads `mrope_section` and
# `interleaved` from its rope_parameters, but transformers 5.24's talker text config does not
# list them among its known keys as the thinker's does (Qwen3OmniMoeTextConfig
# .ignore_keys_at_rope_validation), so every load printed "Unrecognized keys in
# `rope_parameters` for 'rope_type'='default': {'mrope_section', 'interleaved'}" (once per
# stage process). Passed with the config they are set before it validates; save_pretrained
# drops the attribute, so write_tiny_checkpoint puts it back into config.json.
TALKER_ROPE_KEYS = {"ignore_keys_at_rope_validation": ["mrope_section", "interleaved"]}


def build_config(tokenizer: Any, size: str = "tiny") -> Any:
    """The ``Qwen3OmniMoeConfig`` of ``size`` (a key of :data:`SIZES`) whose special-token
    ids come from ``tokenizer``."""
    from transformers import Qwen3OmniMoeConfig

    w = SIZES[size]
    tid = tokenizer.convert_tokens_to_ids
    vocab_size = max(len(tokenizer), w.vocab)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(w.mrope_section), "interleaved": True}
    audio_config = {
        "num_mel_bins": 128,
        "encoder_layers": 2,
        "encoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "d_model": HIDDEN,
        "output_dim": w.hidden,
        "n_window": 50,
        "n_window_infer": 800,
        "conv_chunksize": 500,
        "downsample_hidden_size": 16,
        "max_source_positions": 1500,
    }
    token_ids = {
        "audio_token_id": tid("<|audio_pad|>"),
        "image_token_id": tid("<|image_pad|>"),
        "video_token_id": tid("<|video_pad|>"),
        "audio_start_token_id": tid("<|audio_start|>"),
        "vision_start_token_id": tid("<|vision_start|>"),
    }
    codec = w.codebook + 1024
    talker_specials = {
        "codec_pad_id": codec - 8,
        "codec_bos_id": codec - 7,
        "codec_eos_token_id": codec - 6,
        "codec_nothink_id": codec - 5,
        "codec_think_bos_id": codec - 4,
        "codec_think_eos_id": codec - 3,
    }
    thinker = {
        "audio_config": audio_config,
        "vision_config": {
            "depth": 2,
            "hidden_size": HIDDEN,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": w.hidden,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [1],
            # Read by vLLM's vision tower (the released config has them; transformers' config class does not).
            "image_size": 16 * 8,  # patch_size * sqrt(num_position_embeddings)
            "apply_vit_abs_pos_embed": True,
        },
        "text_config": {
            "vocab_size": vocab_size,
            "hidden_size": w.hidden,
            "intermediate_size": 2 * w.hidden,
            "num_hidden_layers": w.layers,
            "num_attention_heads": w.heads,
            "num_key_value_heads": w.kv_heads,
            "head_dim": w.head_dim,
            "moe_intermediate_size": w.moe_intermediate,
            "num_experts": w.experts,
            "num_experts_per_tok": w.experts_per_token,
            "rope_parameters": rope,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,  # read by vLLM's thinker; transformers 5.24 keeps it top-level only
        },
        "user_token_id": _single_token(tokenizer, "user"),
        **token_ids,
    }
    talker = {
        "text_config": {
            "vocab_size": codec,
            "hidden_size": w.talker_hidden,
            "intermediate_size": 2 * w.talker_hidden,
            "num_hidden_layers": w.talker_layers,
            "num_attention_heads": w.talker_heads,
            "num_key_value_heads": w.talker_kv_heads,
            "head_dim": w.head_dim,
            "moe_intermediate_size": w.talker_moe_intermediate,
            "num_experts": w.experts,
            "num_experts_per_tok": w.talker_experts_per_token,
            "shared_expert_intermediate_size": w.talker_shared_intermediate,  # not defaulted by transformers 5.x
            "rope_parameters": rope,
            **TALKER_ROPE_KEYS,
            "max_position_embeddings": 4096,
        },
        "code_predictor_config": {
            "vocab_size": w.codebook,
            "hidden_size": w.talker_hidden,
            "intermediate_size": w.predictor_intermediate,
            "num_hidden_layers": w.predictor_layers,
            "num_attention_heads": w.talker_heads,
            "num_key_value_heads": w.talker_kv_heads,
            "head_dim": w.head_dim,
            "num_code_groups": w.code_groups,
            "max_position_embeddings": 64,
        },
        "num_code_groups": w.code_groups,
        "thinker_hidden_size": w.hidden,
        "accept_hidden_layer": w.accept_hidden_layer,
        "speaker_id": {SPEAKER: codec - 2},
        "spatial_merge_size": 2,  # read by the talker for 3D positions of image tokens
        "audio_config": audio_config,  # the talker's 3D positions for audio read `audio_config.n_window`
        **talker_specials,
        **token_ids,
    }
    code2wav = {
        "codebook_size": w.codebook,
        "hidden_size": w.vocoder_hidden,
        "num_hidden_layers": w.vocoder_layers,
        "num_attention_heads": w.vocoder_heads,
        "num_key_value_heads": w.vocoder_heads,
        "intermediate_size": w.vocoder_intermediate,
        "sliding_window": w.vocoder_window,
        "num_quantizers": w.code_groups,
        "upsample_rates": list(w.upsample_rates),
        "upsampling_ratios": list(w.upsampling_ratios),
        "decoder_dim": w.decoder_dim,
    }
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        im_start_token_id=tid("<|im_start|>"),
        im_end_token_id=tid("<|im_end|>"),
        tts_pad_token_id=tid("<|tts_pad|>"),
        tts_bos_token_id=tid("<|tts_bos|>"),
        tts_eos_token_id=tid("<|tts_eos|>"),
        system_token_id=_single_token(tokenizer, "system"),
        user_token_id=_single_token(tokenizer, "user"),
        assistant_token_id=_single_token(tokenizer, "assistant"),
    )


def write_tiny_checkpoint(out_dir: str | Path, seed: int = 0, size: str = "tiny", device: str = "cpu") -> Path:
    """Write config, random weights (seeded), tokenizer and processor files into ``out_dir``.
    ``device``: where the weights are initialised (``cuda`` makes ``real`` quick); sizes
    other than ``tiny`` are stored in bfloat16 (half the disk; stages load float32)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer()
    config = build_config(tokenizer, size)
    model = random_model(
        Qwen3OmniMoeForConditionalGeneration, config, seed=seed, device=device, bfloat16=not size.startswith("tiny")
    )
    model.save_pretrained(out)
    config_file = out / "config.json"
    saved = json.loads(config_file.read_text())
    saved["talker_config"]["text_config"].update(TALKER_ROPE_KEYS)
    config_file.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    _save_processor(_build_processor(tokenizer), out)
    return out


def main(argv: list[str] | None = None) -> int:
    return writer_main(argv, doc=__doc__, sizes=SIZES, write=write_tiny_checkpoint, name="Qwen3-Omni")


if __name__ == "__main__":
    sys.exit(main())

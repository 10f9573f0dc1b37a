"""Write a tiny random-weight Qwen3-Omni checkpoint for tests and CPU benchmarks.

The checkpoint has the real architecture (thinker with audio and vision towers,
talker with its code predictor, code2wav vocoder) at hidden size 32 and two
layers, plus a real processor: a byte-level BPE tokenizer trained here on a few
sentences, a Whisper feature extractor and a Qwen2-VL image processor. Nothing is
downloaded. Run ``python -m omnictl.models.qwen3_omni.tiny OUT_DIR``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

CODEBOOK_SIZE = 64  # code2wav codebook; the talker's own vocabulary adds 1024 suppressed specials on top
NUM_CODE_GROUPS = 4
HIDDEN = 32
SPEAKER = "ethan"

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


def _build_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    bpe.train_from_iterator(list(_CORPUS) * 20, trainer=trainer)
    vocab = bpe.get_vocab()
    merges = [tuple(pair) for pair in json.loads(bpe.to_str())["model"]["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "audio_token": "<|audio_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
        },
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=4096,
    )
    # Already in the vocabulary; registering them keeps the BPE from splitting them apart.
    tokenizer.add_tokens([AddedToken(token, special=True) for token in SPECIAL_TOKENS])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


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


def build_config(tokenizer: Any) -> Any:
    """The tiny ``Qwen3OmniMoeConfig`` whose special-token ids come from ``tokenizer``."""
    from transformers import Qwen3OmniMoeConfig

    tid = tokenizer.convert_tokens_to_ids
    vocab_size = len(tokenizer)
    # mrope sections must sum to head_dim / 2 (= 8 with two heads of 16).
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2], "interleaved": True}
    audio_config = {
        "num_mel_bins": 128,
        "encoder_layers": 2,
        "encoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "d_model": HIDDEN,
        "output_dim": HIDDEN,
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
    codec = CODEBOOK_SIZE + 1024
    talker_specials = {
        "codec_pad_id": codec - 8,
        "codec_bos_id": codec - 7,
        "codec_eos_token_id": codec - 6,
        "codec_nothink_id": codec - 5,
        "codec_think_bos_id": codec - 4,
        "codec_think_eos_id": codec - 3,
    }
    # The thinker's and the talker's decoders share one tiny MoE shape.
    moe_text = {
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "moe_intermediate_size": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "rope_parameters": rope,
        "max_position_embeddings": 4096,
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
            "out_hidden_size": HIDDEN,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [1],
        },
        "text_config": {"vocab_size": vocab_size, **moe_text},
        "user_token_id": _single_token(tokenizer, "user"),
        **token_ids,
    }
    talker = {
        "text_config": {
            "vocab_size": codec,
            **moe_text,
            "shared_expert_intermediate_size": 32,  # not defaulted by transformers 5.x
        },
        "code_predictor_config": {
            "vocab_size": CODEBOOK_SIZE,
            "hidden_size": HIDDEN,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "num_code_groups": NUM_CODE_GROUPS,
            "max_position_embeddings": 64,
        },
        "num_code_groups": NUM_CODE_GROUPS,
        "thinker_hidden_size": HIDDEN,
        "accept_hidden_layer": 1,
        "speaker_id": {SPEAKER: codec - 2},
        "spatial_merge_size": 2,  # read by the talker for 3D positions of image tokens
        "audio_config": audio_config,  # the talker's 3D positions for audio read `audio_config.n_window`
        **talker_specials,
        **token_ids,
    }
    code2wav = {
        "codebook_size": CODEBOOK_SIZE,
        "hidden_size": HIDDEN,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "sliding_window": 8,
        "num_quantizers": NUM_CODE_GROUPS,
        "upsample_rates": [4, 4],
        "upsampling_ratios": [2],
        "decoder_dim": 32,
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


def write_tiny_checkpoint(out_dir: str | Path, seed: int = 0) -> Path:
    """Write config, random weights (seeded), tokenizer and processor files into ``out_dir``."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer()
    config = build_config(tokenizer)
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(config)
    model.save_pretrained(out)
    _save_processor(_build_processor(tokenizer), out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="directory to write the checkpoint into (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")
    args = parser.parse_args(argv)
    path = write_tiny_checkpoint(args.out_dir, seed=args.seed)
    print(f"tiny Qwen3-Omni checkpoint written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write a random-weight Qwen3-ASR checkpoint for tests, docs and benchmarks.

The checkpoint has the real architecture (transformers' ``Qwen3ASRForConditionalGeneration``:
the AuT audio encoder with its convolutional downsampling, the projector, a Qwen3 decoder)
and a real processor (``Qwen3ASRProcessor``: its 128-bin log-mel feature extractor and a
byte-level BPE tokenizer trained here on a few sentences, with the chat template the
released model's prompt has). Nothing is downloaded. Sizes (:data:`SIZES`):

- ``tiny``: widths of 32, two layers each; builds in well under a second and decodes a
  token in about a millisecond on a CPU (tests: it measures the runtime, not the model);
- ``real``: the released Qwen3-ASR-1.7B's widths and depths (audio encoder 24 x 1024,
  decoder 28 x 2048, its 151,936-token vocabulary), for a GPU.

Random weights hear nothing: a tiny checkpoint answers gibberish until ``max_tokens``
(or until it happens to draw an end token).

Run ``python -m omnictl.models.qwen3_asr.tiny OUT_DIR [--size real]``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnictl.models.tiny_checkpoint import check_size, qwen2_tokenizer, random_model, train_byte_level_bpe, writer_main

SAMPLE_RATE = 16_000  # what the feature extractor hears


@dataclass(frozen=True)
class Widths:
    encoder_width: int
    encoder_layers: int
    encoder_heads: int
    encoder_ffn: int
    downsample: int  # channels of the three 2-D convolutions
    hidden: int  # decoder
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    init_std: float = 0.02  # of the random weights (transformers' initializer_range)
    vocab: int = 0  # 0: the tokenizer's own; larger pads the embedding (the released vocabulary)


SIZES: dict[str, Widths] = {
    "tiny": Widths(
        encoder_width=32,
        encoder_layers=2,
        encoder_heads=2,
        encoder_ffn=64,
        downsample=16,
        hidden=32,
        layers=2,
        heads=2,
        kv_heads=1,
        head_dim=16,
        intermediate=64,
        # At transformers' 0.02 a random decoder this small repeats one token whatever it
        # hears; wider weights make the answer differ from token to token and clip to clip,
        # so a test comparing tokens with transformers' can fail.
        init_std=1.0,
    ),
    "real": Widths(
        encoder_width=1024,
        encoder_layers=24,
        encoder_heads=16,
        encoder_ffn=4096,
        downsample=480,
        hidden=2048,
        layers=28,
        heads=16,
        kv_heads=8,
        head_dim=128,
        intermediate=6144,
        vocab=151936,
    ),
}

# Special tokens, in the order they get ids (the released tokenizer's names).
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<timestamp>",
)
# Not special: the processor finds it in decoded text (skip_special_tokens=True) to split
# "language English<asr_text>" from the transcription.
ASR_TEXT = "<asr_text>"

_CORPUS = (
    "system\nuser\nassistant\n" * 30,
    "language English language Chinese language French language German language None\n" * 5,
    "Hello, how are you today? What is the capital of France? Paris is the capital of France.\n",
    "The quick brown fox jumps over the lazy dog. 0123456789 yes no maybe thanks goodbye.\n",
    "Please transcribe this recording of a meeting about the weather and the train timetable.\n",
)

# The released prompt: a system turn holding the context (empty without one), the user's
# audio between its start and end markers, then the assistant's turn. transformers'
# ``apply_transcription_request`` continues the assistant's message, which holds
# "language NAME<asr_text>" when the language is forced.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}{{- '<|im_start|>system\\n<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('audio', 'input_audio') -%}{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_tokenizer() -> Any:
    bpe = train_byte_level_bpe(_CORPUS, [*SPECIAL_TOKENS, ASR_TEXT], vocab_size=512)
    return qwen2_tokenizer(
        bpe,
        special_tokens=SPECIAL_TOKENS,
        plain_tokens=[ASR_TEXT],
        extra_special_tokens={
            "audio_token": "<|audio_pad|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
        },
        chat_template=CHAT_TEMPLATE,
    )


def build_processor(tokenizer: Any) -> Any:
    from transformers import Qwen3ASRFeatureExtractor, Qwen3ASRProcessor

    return Qwen3ASRProcessor(
        feature_extractor=Qwen3ASRFeatureExtractor(), tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )


def build_config(tokenizer: Any, size: str = "tiny") -> Any:
    """The ``Qwen3ASRConfig`` of ``size`` (a key of :data:`SIZES`), its token ids from ``tokenizer``."""
    from transformers import Qwen3ASRConfig

    w = SIZES[size]
    tid = tokenizer.convert_tokens_to_ids
    config = Qwen3ASRConfig(
        audio_config={
            "num_mel_bins": 128,
            "encoder_layers": w.encoder_layers,
            "encoder_attention_heads": w.encoder_heads,
            "encoder_ffn_dim": w.encoder_ffn,
            "d_model": w.encoder_width,
            "output_dim": w.hidden,
            "n_window": 50,  # the processor's n_window: 100 mel frames (1 s) per encoder chunk
            "n_window_infer": 800,
            "downsample_hidden_size": w.downsample,
        },
        text_config={
            "model_type": "qwen3",
            "vocab_size": max(len(tokenizer), w.vocab),
            "hidden_size": w.hidden,
            "intermediate_size": w.intermediate,
            "num_hidden_layers": w.layers,
            "num_attention_heads": w.heads,
            "num_key_value_heads": w.kv_heads,
            "head_dim": w.head_dim,
            "max_position_embeddings": 4096 if size == "tiny" else 65536,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "tie_word_embeddings": True,
        },
        audio_token_id=tid("<|audio_pad|>"),
        timestamp_token_id=tid("<timestamp>"),
        pad_token_id=tid("<|endoftext|>"),
        eos_token_id=[tid("<|endoftext|>"), tid("<|im_end|>")],
        tie_word_embeddings=True,
    )
    parts: tuple[Any, ...] = (config, config.audio_config, config.text_config)  # built: configs, not dicts
    for part in parts:
        part.initializer_range = w.init_std
    return config


def write_tiny_checkpoint(out_dir: str | Path, seed: int = 0, size: str = "tiny", device: str = "cpu") -> Path:
    """Write config, random weights (seeded), tokenizer and processor files into ``out_dir``.
    ``device``: where the weights are initialised; ``real`` is stored in bfloat16."""
    from transformers import Qwen3ASRForConditionalGeneration

    check_size(size, SIZES)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = build_config(tokenizer, size)
    model = random_model(Qwen3ASRForConditionalGeneration, config, seed=seed, device=device, bfloat16=size != "tiny")
    model.generation_config.eos_token_id = list(config.eos_token_id)
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out)
    build_processor(tokenizer).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    return writer_main(argv, doc=__doc__, sizes=SIZES, write=write_tiny_checkpoint, name="Qwen3-ASR")


if __name__ == "__main__":
    sys.exit(main())

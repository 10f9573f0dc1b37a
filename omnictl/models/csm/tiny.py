"""Write a random-weight CSM checkpoint (Sesame's Conversational Speech Model) for tests and benchmarks.

The checkpoint has the real architecture of ``transformers.CsmForConditionalGeneration``:
the backbone (a Llama over frames, predicting each frame's first codebook), the depth
decoder (a small Llama over one frame's codebooks, predicting the rest) and its Mimi
codec, plus a real ``CsmProcessor``: a byte-level BPE tokenizer trained here on a few
sentences, with CSM's special tokens and chat template, and Mimi's feature extractor.
Nothing is downloaded. Two sizes (:data:`SIZES`):

- ``tiny``: width 32, two layers, 8 codebooks of 64 codes; builds and runs in well under
  a second on a CPU (tests), so it measures the runtime's own cost;
- ``real``: the backbone, depth decoder and Mimi at the released ``sesame/csm-1b`` widths
  and depths (32 codebooks of 2,051 codes, 16 + 4 layers), for a GPU.

At ``tiny`` the backbone's codebook vocabulary equals Mimi's codebook (64): random
weights may pick any code, and every code must be one Mimi can decode. The released
model has 2,051 (Mimi's 2,048 plus three specials it learnt never to emit mid-speech).

Run ``python -m omnictl.models.csm.tiny OUT_DIR [--size real]``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnictl.models.tiny_checkpoint import (
    check_size,
    fast_tokenizer,
    random_model,
    token_id,
    train_byte_level_bpe,
    write_marker,
    writer_main,
)

SAMPLE_RATE = 24_000  # Mimi's rate at every size

BOS, EOS, AUDIO, AUDIO_EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>", "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, AUDIO, AUDIO_EOS, PAD)

# CSM's template: each turn is its speaker id in brackets and its text between
# begin- and end-of-text, then its audio (if any) as audio frames and an end-of-audio.
# The role is the speaker id ("0", "1", ...), as in sesame/csm-1b's template.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if not (message['role'] is string and message['role'].isdigit()) -%}"
    "{{- raise_exception('the role must be a speaker id such as \"0\"') -}}{%- endif -%}"
    "{%- for part in message['content'] if part['type'] == 'text' -%}"
    "{{- '" + BOS + "[' + message['role'] + ']' + part['text'] + '" + EOS + "' -}}"
    "{%- endfor -%}"
    "{%- for part in message['content'] if part['type'] == 'audio' -%}"
    "{{- '" + AUDIO + AUDIO_EOS + "' -}}"
    "{%- endfor -%}"
    "{%- endfor -%}"
)

_CORPUS = (
    "Hello there, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "Speech synthesis turns written words into sound.",
    "Please read this sentence aloud, slowly and clearly.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
    "What is the weather like in Paris this morning?",
    "A conversational speech model speaks in context.",
)


@dataclass(frozen=True)
class Widths:
    """The sizes that differ between :data:`SIZES`."""

    hidden: int  # backbone
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    depth_hidden: int
    depth_layers: int
    depth_heads: int
    depth_kv_heads: int
    depth_intermediate: int
    codebooks: int
    codebook_vocab: int  # the backbone's and depth decoder's codes per codebook
    text_vocab: int  # 0: the tokenizer's own
    mimi_hidden: int
    mimi_filters: int
    mimi_layers: int
    mimi_heads: int
    mimi_intermediate: int
    mimi_codebook: int
    mimi_codebook_dim: int


SIZES: dict[str, Widths] = {
    "tiny": Widths(
        hidden=32,
        layers=2,
        heads=2,
        kv_heads=1,
        intermediate=64,
        depth_hidden=32,
        depth_layers=2,
        depth_heads=2,
        depth_kv_heads=1,
        depth_intermediate=64,
        codebooks=8,
        codebook_vocab=64,
        text_vocab=0,
        mimi_hidden=32,
        mimi_filters=4,
        mimi_layers=1,
        mimi_heads=2,
        mimi_intermediate=64,
        mimi_codebook=64,
        mimi_codebook_dim=16,
    ),
    # sesame/csm-1b: a Llama-3.2-1B backbone and a 100M depth decoder; kyutai's Mimi.
    "real": Widths(
        hidden=2048,
        layers=16,
        heads=32,
        kv_heads=8,
        intermediate=8192,
        depth_hidden=1024,
        depth_layers=4,
        depth_heads=8,
        depth_kv_heads=2,
        depth_intermediate=8192,
        codebooks=32,
        codebook_vocab=2051,
        text_vocab=128256,
        mimi_hidden=512,
        mimi_filters=64,
        mimi_layers=8,
        mimi_heads=8,
        mimi_intermediate=2048,
        mimi_codebook=2048,
        mimi_codebook_dim=256,
    ),
}


def build_tokenizer() -> Any:
    bpe = train_byte_level_bpe(_CORPUS, SPECIAL_TOKENS, vocab_size=384, byte_level_decoder=True)
    return fast_tokenizer(
        bpe,
        chat_template=CHAT_TEMPLATE,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens={"audio_token": AUDIO, "audio_eos_token": AUDIO_EOS},
        model_max_length=2048,
    )


def build_processor(tokenizer: Any) -> Any:
    from transformers import CsmProcessor, EncodecFeatureExtractor

    feature_extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=SAMPLE_RATE, padding_value=0.0)
    return CsmProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)


def _token(tokenizer: Any, text: str) -> int:
    return token_id(tokenizer, text, "CSM")


def build_config(tokenizer: Any, size: str = "tiny") -> Any:
    """The ``CsmConfig`` of ``size`` (a key of :data:`SIZES`) whose special-token ids come from ``tokenizer``."""
    from transformers import CsmConfig

    check_size(size, SIZES)
    w = SIZES[size]
    rope = {"rope_type": "default", "rope_theta": 500000.0}
    mimi = {
        "model_type": "mimi",
        "sampling_rate": SAMPLE_RATE,
        "hidden_size": w.mimi_hidden,
        "num_filters": w.mimi_filters,
        "num_hidden_layers": w.mimi_layers,
        "num_attention_heads": w.mimi_heads,
        "num_key_value_heads": w.mimi_heads,
        "intermediate_size": w.mimi_intermediate,
        "codebook_size": w.mimi_codebook,
        "codebook_dim": w.mimi_codebook_dim,
        "vector_quantization_hidden_dimension": w.mimi_codebook_dim,
        "num_quantizers": w.codebooks,
        "num_semantic_quantizers": 1,
        "upsample_groups": w.mimi_hidden,
    }
    text_vocab = w.text_vocab or len(tokenizer)
    depth = {
        "num_codebooks": w.codebooks,
        "backbone_hidden_size": w.hidden,
        "vocab_size": w.codebook_vocab,
        "hidden_size": w.depth_hidden,
        "intermediate_size": w.depth_intermediate,
        "num_hidden_layers": w.depth_layers,
        "num_attention_heads": w.depth_heads,
        "num_key_value_heads": w.depth_kv_heads,
        "max_position_embeddings": w.codebooks + 1,
        "rope_parameters": rope,
    }
    return CsmConfig(
        num_codebooks=w.codebooks,
        vocab_size=w.codebook_vocab,
        text_vocab_size=text_vocab,
        hidden_size=w.hidden,
        intermediate_size=w.intermediate,
        num_hidden_layers=w.layers,
        num_attention_heads=w.heads,
        num_key_value_heads=w.kv_heads,
        max_position_embeddings=2048,
        rope_parameters=rope,
        bos_token_id=_token(tokenizer, BOS),
        pad_token_id=_token(tokenizer, PAD),
        audio_token_id=_token(tokenizer, AUDIO),
        audio_eos_token_id=_token(tokenizer, AUDIO_EOS),
        codebook_eos_token_id=0,
        # The released 2050 is outside a 64-code vocabulary; it only pads finished rows of a batch.
        codebook_pad_token_id=w.codebook_vocab - 1 if size == "tiny" else 2050,
        depth_decoder_config=depth,
        codec_config=mimi,
    )


def write_tiny_checkpoint(out_dir: str | Path, seed: int = 0, size: str = "tiny", device: str = "cpu") -> Path:
    """Write config, random weights (seeded), tokenizer and processor files into ``out_dir``.
    ``real`` is stored in bfloat16 (half the disk; the stages load float32 on CPU)."""
    from transformers import CsmForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = build_config(tokenizer, size)
    model = random_model(CsmForConditionalGeneration, config, seed=seed, device=device, bfloat16=size != "tiny")
    model.save_pretrained(out)
    build_processor(tokenizer).save_pretrained(out)
    write_marker(out, "csm", size, seed)
    return out


def main(argv: list[str] | None = None) -> int:
    return writer_main(argv, doc=__doc__, sizes=SIZES, write=write_tiny_checkpoint, name="CSM")


if __name__ == "__main__":
    sys.exit(main())

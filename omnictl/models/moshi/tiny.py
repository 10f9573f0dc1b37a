"""Write a random-weight Moshi checkpoint (kyutai's full-duplex speech model) for tests and benchmarks.

The checkpoint has the real architecture of ``transformers.MoshiForConditionalGeneration``:
Mimi (the audio codec, ``audio_encoder``), the temporal transformer (``decoder``: one step
per 80 ms frame, reading the previous text token, Moshi's own audio codes and the user's,
scoring the next text token) and the depth transformer (``depth_decoder``: one frame's
audio codebooks from the temporal transformer's hidden state), plus a byte-level BPE
tokenizer trained here on a few sentences (kyutai's special ids: 0 ``<unk>``, 1 ``<s>``,
2 ``</s>``, 3 ``<pad>``, the text padding Moshi speaks between words) and Mimi's feature
extractor. Nothing is downloaded. Two sizes (:data:`SIZES`):

- ``tiny``: width 32, two layers, 8 codebooks of 64 codes; builds and runs in well under
  a second on a CPU (tests), so it measures the runtime's own cost;
- ``real``: the temporal and depth transformers and Mimi at the released
  ``kmhf/hf-moshiko`` widths and depths (32 + 6 layers, 8 of Mimi's 32 codebooks of
  2,048 codes, a 32,000-token text vocabulary), for a GPU.

Run ``python -m omnictl.models.moshi.tiny OUT_DIR [--size real]``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnictl.models.tiny_checkpoint import fast_tokenizer, random_model, train_byte_level_bpe, write_marker, writer_main

SAMPLE_RATE = 24_000  # Mimi's rate at every size

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = (UNK, BOS, EOS, PAD)  # ids 0..3, as in kyutai's text tokenizer

_CORPUS = (
    "Hello there, how are you today?",
    "I am doing well, thank you for asking.",
    "What would you like to talk about?",
    "The weather is lovely this morning in Paris.",
    "Full duplex means both of us can speak at once.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
    "Tell me a story about a fox and a dog.",
)


@dataclass(frozen=True)
class Widths:
    """The sizes that differ between :data:`SIZES`."""

    hidden: int  # temporal transformer
    layers: int
    heads: int
    ffn: int
    depth_hidden: int
    depth_layers: int
    depth_heads: int
    depth_ffn: int
    codebooks: int  # Moshi's codebooks per frame (each of its two audio streams)
    text_vocab: int  # 0: the tokenizer's own
    mimi_hidden: int
    mimi_filters: int
    mimi_layers: int
    mimi_heads: int
    mimi_intermediate: int
    mimi_quantizers: int
    mimi_codebook: int
    mimi_codebook_dim: int


SIZES: dict[str, Widths] = {
    "tiny": Widths(
        hidden=32,
        layers=2,
        heads=2,
        ffn=64,
        depth_hidden=32,
        depth_layers=2,
        depth_heads=2,
        depth_ffn=64,
        codebooks=8,
        text_vocab=0,
        mimi_hidden=32,
        mimi_filters=4,
        mimi_layers=1,
        mimi_heads=2,
        mimi_intermediate=64,
        mimi_quantizers=8,
        mimi_codebook=64,
        mimi_codebook_dim=16,
    ),
    # kmhf/hf-moshiko: a 7B temporal transformer, a 6-layer depth transformer, kyutai's Mimi.
    "real": Widths(
        hidden=4096,
        layers=32,
        heads=32,
        ffn=22528,
        depth_hidden=1024,
        depth_layers=6,
        depth_heads=16,
        depth_ffn=5632,
        codebooks=8,
        text_vocab=32000,
        mimi_hidden=512,
        mimi_filters=64,
        mimi_layers=8,
        mimi_heads=8,
        mimi_intermediate=2048,
        mimi_quantizers=32,
        mimi_codebook=2048,
        mimi_codebook_dim=256,
    ),
}


def build_tokenizer() -> Any:
    bpe = train_byte_level_bpe(
        _CORPUS, SPECIAL_TOKENS, vocab_size=384, byte_level_decoder=True, unk_token=UNK, add_prefix_space=True
    )
    return fast_tokenizer(
        bpe, chat_template=None, unk_token=UNK, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=4096
    )


def build_feature_extractor() -> Any:
    from transformers import EncodecFeatureExtractor

    return EncodecFeatureExtractor(feature_size=1, sampling_rate=SAMPLE_RATE, padding_value=0.0)


def build_config(tokenizer: Any, size: str = "tiny") -> Any:
    """The ``MoshiConfig`` of ``size`` (a key of :data:`SIZES`) whose special-token ids come from ``tokenizer``."""
    from transformers import MoshiConfig

    if size not in SIZES:
        raise ValueError(f"size: {size!r} is not one of {', '.join(SIZES)}")
    w = SIZES[size]
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
        "num_quantizers": w.mimi_quantizers,
        "num_semantic_quantizers": 1,
        "upsample_groups": w.mimi_hidden,
    }
    depth = {
        "hidden_size": w.depth_hidden,
        "num_hidden_layers": w.depth_layers,
        "num_attention_heads": w.depth_heads,
        "num_key_value_heads": w.depth_heads,
        "ffn_dim": w.depth_ffn,
    }
    return MoshiConfig(
        vocab_size=w.text_vocab or len(tokenizer),
        hidden_size=w.hidden,
        num_hidden_layers=w.layers,
        num_attention_heads=w.heads,
        num_key_value_heads=w.heads,
        ffn_dim=w.ffn,
        num_codebooks=w.codebooks,
        audio_vocab_size=w.mimi_codebook,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        audio_encoder_config=mimi,
        depth_decoder_config=depth,
    )


def write_tiny_checkpoint(out_dir: str | Path, seed: int = 0, size: str = "tiny", device: str = "cpu") -> Path:
    """Write config, random weights (seeded), tokenizer and feature-extractor files into ``out_dir``.
    ``real`` is stored in bfloat16 (half the disk; the stages load float32 on CPU)."""
    from transformers import MoshiForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = build_config(tokenizer, size)
    model = random_model(MoshiForConditionalGeneration, config, seed=seed, device=device, bfloat16=size != "tiny")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    build_feature_extractor().save_pretrained(out)
    write_marker(out, "moshi", size, seed)
    return out


def main(argv: list[str] | None = None) -> int:
    return writer_main(argv, doc=__doc__, sizes=SIZES, write=write_tiny_checkpoint, name="Moshi")


if __name__ == "__main__":
    sys.exit(main())

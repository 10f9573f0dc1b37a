"""Write a random-weight Higgs Audio v2 checkpoint (Boson AI's text-to-speech LLM) for tests and benchmarks.

The checkpoint has the real architecture of ``transformers.HiggsAudioV2ForConditionalGeneration``
(a Llama whose every layer has a second, audio, MLP and norms; one head scoring every
codebook of the next audio frame at once, the codebooks in a delay pattern) and of its
audio tokenizer, ``HiggsAudioV2TokenizerModel`` (a DAC acoustic encoder and decoder, a
HuBERT semantic model, residual vector quantization), written in ``audio_tokenizer/``
beside the model. The text side is a real ``HiggsAudioV2Processor``: a byte-level BPE
tokenizer trained here on a few sentences, with Higgs Audio's special tokens and a chat
template that ends the prompt with ``<|audio_out_bos|>``, and DAC's feature extractor.
Nothing is downloaded. Two sizes (:data:`SIZES`):

- ``tiny``: width 32, two layers, 8 codebooks of 64 codes, a codec of a few thousand
  weights at the released frame rate (25 Hz: 960 samples a frame at 24 kHz); builds and
  runs in well under a second on a CPU (tests: it measures the runtime, not the model);
- ``real``: the released ``bosonai/higgs-audio-v2-generation-3B-base`` widths and depths
  (28 x 3072, 8 codebooks of 1,024 codes plus the stream's begin and end codes) and the
  released audio tokenizer's (DAC 1024 decoder channels, HuBERT base), for a GPU.

The model's codebook holds the codec's codes plus two: ``audio_stream_bos_id`` (the
codec's codebook size) and ``audio_stream_eos_id`` (one more), as in the released model.

Random weights say nothing: the tiny checkpoint's audio is noise, and whether it ends by
itself is chance; bound it with ``max_tokens`` (frames of 40 ms).

Run ``python -m omnictl.models.higgs_audio.tiny OUT_DIR [--size real]``.
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

SAMPLE_RATE = 24_000  # the audio tokenizer's rate at every size

BOS, EOT, PAD = "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"
HEADER_START, HEADER_END = "<|start_header_id|>", "<|end_header_id|>"
AUDIO_OUT, AUDIO_OUT_BOS, AUDIO_EOS = "<|AUDIO_OUT|>", "<|audio_out_bos|>", "<|audio_eos|>"
AUDIO_DELAY = "<|reserved_special_token_6|>"  # the released model's name for the delay token
AUDIO_IN, AUDIO_BOS = "<|AUDIO|>", "<|audio_bos|>"
SCENE_START, SCENE_END = "<|scene_desc_start|>", "<|scene_desc_end|>"
SPECIAL_TOKENS = (
    BOS,
    PAD,
    EOT,
    HEADER_START,
    HEADER_END,
    AUDIO_IN,
    AUDIO_BOS,
    AUDIO_OUT,
    AUDIO_OUT_BOS,
    AUDIO_EOS,
    AUDIO_DELAY,
    SCENE_START,
    SCENE_END,
)

# Higgs Audio's prompt (boson_multimodal's ChatML-over-Llama-3 format): each turn is its
# role in a header, then its text; a "scene" message is the scene description, put into
# the system turn between its markers; an assistant turn's audio is <|audio_out_bos|>,
# the frames and <|audio_eos|>. The generation prompt opens the assistant's audio.
CHAT_TEMPLATE = (
    "{{- '" + BOS + "' -}}"
    "{%- set scene = namespace(text='') -%}"
    "{%- for message in messages if message['role'] == 'scene' -%}"
    "{%- for part in message['content'] if part['type'] == 'text' -%}"
    "{%- set scene.text = scene.text + part['text'] -%}{%- endfor -%}{%- endfor -%}"
    "{%- for message in messages if message['role'] != 'scene' -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('the role must be system, scene, user or assistant') -}}{%- endif -%}"
    "{{- '" + HEADER_START + "' + message['role'] + '" + HEADER_END + "\\n\\n' -}}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] == 'audio' and message['role'] == 'assistant' -%}"
    "{{- '" + AUDIO_OUT_BOS + AUDIO_OUT + AUDIO_EOS + "' -}}"
    "{%- elif part['type'] == 'audio' -%}{{- '" + AUDIO_BOS + AUDIO_IN + AUDIO_EOS + "' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if message['role'] == 'system' and scene.text -%}"
    "{{- '\\n\\n" + SCENE_START + "\\n' + scene.text + '\\n" + SCENE_END + "' -}}{%- endif -%}"
    "{{- '" + EOT + "' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '" + HEADER_START + "assistant" + HEADER_END + "\\n\\n" + AUDIO_OUT_BOS + "' -}}"
    "{%- endif -%}"
)

# The system message of Boson AI's examples: a request without one gets it.
SYSTEM_PROMPT = "Generate audio following instruction."

_CORPUS = (
    "Generate audio following instruction.",
    "Audio is recorded from a quiet room.",
    "Hello there, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "The sun rises in the east and sets in the west.",
    "Speech synthesis turns written words into sound.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
)


@dataclass(frozen=True)
class Widths:
    """The sizes that differ between :data:`SIZES`."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    codebooks: int
    codes: int  # the codec's codes per codebook (the model's codebook has two more)
    text_vocab: int  # 0: the tokenizer's own
    init_std: float
    dac_encoder_hidden: int
    dac_decoder_hidden: int
    dac_hidden: int
    codebook_dim: int
    hubert_hidden: int
    hubert_layers: int
    hubert_heads: int
    hubert_intermediate: int
    hubert_conv: int


SIZES: dict[str, Widths] = {
    "tiny": Widths(
        hidden=32,
        layers=2,
        heads=2,
        kv_heads=1,
        head_dim=16,
        intermediate=64,
        codebooks=8,
        codes=64,
        text_vocab=0,
        # At transformers' 0.02 a random model this small says the same frame again and
        # again; wider weights make the codes differ from frame to frame and codebook to
        # codebook, so a test comparing them with transformers' can fail.
        init_std=0.5,
        dac_encoder_hidden=4,
        dac_decoder_hidden=32,  # halved at each of the 5 upsamplings: 1 channel at 24 kHz
        dac_hidden=16,
        codebook_dim=8,
        hubert_hidden=16,
        hubert_layers=1,
        hubert_heads=2,
        hubert_intermediate=32,
        hubert_conv=16,
    ),
    # bosonai/higgs-audio-v2-generation-3B-base and bosonai/higgs-audio-v2-tokenizer.
    "real": Widths(
        hidden=3072,
        layers=28,
        heads=24,
        kv_heads=8,
        head_dim=128,
        intermediate=8192,
        codebooks=8,
        codes=1024,
        text_vocab=128256,
        init_std=0.02,
        dac_encoder_hidden=64,
        dac_decoder_hidden=1024,
        dac_hidden=256,
        codebook_dim=64,
        hubert_hidden=768,
        hubert_layers=12,
        hubert_heads=12,
        hubert_intermediate=3072,
        hubert_conv=512,
    ),
}

# The released audio tokenizer: 960 samples a frame at 24 kHz (25 Hz).
RATIOS = [8, 5, 4, 2, 3]
FRAME_RATE = 25


def bandwidths(w: Widths) -> list[float]:
    """The codec's bandwidths (kbps) for a quarter, half, three quarters and all of its codebooks:
    the released [0.5, 1, 1.5, 2] for 8 codebooks of 10 bits; the codec counts its codebooks from
    the last one, so it must be exactly ``codebooks`` of ``log2(codes)`` bits at 25 Hz."""
    bits = (w.codes - 1).bit_length()
    top = w.codebooks * FRAME_RATE * bits / 1000
    return [top * quarter / 4 for quarter in (1, 2, 3, 4)]


def build_tokenizer() -> Any:
    bpe = train_byte_level_bpe(_CORPUS, SPECIAL_TOKENS, vocab_size=384, byte_level_decoder=True)
    return fast_tokenizer(
        bpe,
        chat_template=CHAT_TEMPLATE,
        bos_token=BOS,
        eos_token=EOT,
        pad_token=PAD,
        extra_special_tokens={
            "audio_token": AUDIO_OUT,
            "audio_bos_token": AUDIO_OUT_BOS,
            "audio_eos_token": AUDIO_EOS,
            "audio_delay_token": AUDIO_DELAY,
        },
        model_max_length=2048,
    )


def _token(tokenizer: Any, text: str) -> int:
    return token_id(tokenizer, text, "Higgs Audio")


def build_audio_tokenizer_config(size: str = "tiny") -> Any:
    from transformers import HiggsAudioV2TokenizerConfig

    w = SIZES[size]
    acoustic = {
        "model_type": "dac",
        "encoder_hidden_size": w.dac_encoder_hidden,
        "downsampling_ratios": RATIOS,
        "decoder_hidden_size": w.dac_decoder_hidden,
        "upsampling_ratios": RATIOS,
        "hidden_size": w.dac_hidden,
        "sampling_rate": SAMPLE_RATE,
    }
    semantic = {
        "model_type": "hubert",
        "hidden_size": w.hubert_hidden,
        "num_hidden_layers": w.hubert_layers,
        "num_attention_heads": w.hubert_heads,
        "intermediate_size": w.hubert_intermediate,
        "conv_dim": [w.hubert_conv] * 7,
        "num_conv_pos_embeddings": 16 if size == "tiny" else 128,
        "num_conv_pos_embedding_groups": 2 if size == "tiny" else 16,
        "mask_time_prob": 0.0,
    }
    return HiggsAudioV2TokenizerConfig(
        target_bandwidths=bandwidths(w),
        sample_rate=SAMPLE_RATE,
        codebook_size=w.codes,
        codebook_dim=w.codebook_dim,
        acoustic_model_config=acoustic,
        semantic_model_config=semantic,
    )


def build_config(tokenizer: Any, size: str = "tiny") -> Any:
    """The ``HiggsAudioV2Config`` of ``size`` (a key of :data:`SIZES`) whose special-token ids come from ``tokenizer``."""
    from transformers import HiggsAudioV2Config

    check_size(size, SIZES)
    w = SIZES[size]
    return HiggsAudioV2Config(
        vocab_size=w.text_vocab or len(tokenizer),
        hidden_size=w.hidden,
        intermediate_size=w.intermediate,
        num_hidden_layers=w.layers,
        num_attention_heads=w.heads,
        num_key_value_heads=w.kv_heads,
        head_dim=w.head_dim,
        initializer_range=w.init_std,
        max_position_embeddings=2048 if size == "tiny" else 8192,
        pad_token_id=_token(tokenizer, PAD),
        bos_token_id=_token(tokenizer, BOS),
        eos_token_id=_token(tokenizer, EOT),
        num_codebooks=w.codebooks,
        codebook_size=w.codes + 2,  # the codec's codes, then the stream's begin and end
        audio_token_id=_token(tokenizer, AUDIO_OUT),
        audio_bos_token_id=_token(tokenizer, AUDIO_OUT_BOS),
        audio_delay_token_id=_token(tokenizer, AUDIO_DELAY),
        audio_stream_bos_id=w.codes,
        audio_stream_eos_id=w.codes + 1,
    )


def build_processor(tokenizer: Any, audio_tokenizer: Any) -> Any:
    from transformers import DacFeatureExtractor, HiggsAudioV2Processor

    feature_extractor = DacFeatureExtractor(feature_size=1, sampling_rate=SAMPLE_RATE, hop_length=960)
    bos = int(audio_tokenizer.config.codebook_size)
    return HiggsAudioV2Processor(
        feature_extractor=feature_extractor,
        tokenizer=tokenizer,
        audio_tokenizer=audio_tokenizer,
        chat_template=CHAT_TEMPLATE,
        audio_stream_bos_id=bos,
        audio_stream_eos_id=bos + 1,
    )


def write_tiny_checkpoint(out_dir: str | Path, seed: int = 0, size: str = "tiny", device: str = "cpu") -> Path:
    """Write config, random weights (seeded), tokenizer and processor files into ``out_dir``,
    the audio tokenizer into ``out_dir/audio_tokenizer``. ``real`` is stored in bfloat16
    (half the disk; the stages load float32 on CPU)."""
    import torch
    from transformers import HiggsAudioV2ForConditionalGeneration

    from omnictl.models.higgs_audio.codec import AUDIO_TOKENIZER_DIR, audio_tokenizer_class

    HiggsAudioV2TokenizerModel = audio_tokenizer_class()  # transformers' class, without torchaudio
    check_size(size, SIZES)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = build_config(tokenizer, size)
    codec_config = build_audio_tokenizer_config(size)
    if codec_config.num_quantizers != config.num_codebooks:
        raise RuntimeError(f"the codec has {codec_config.num_quantizers} codebooks, the model {config.num_codebooks}")
    # The model, then the codec, from one seed (the codec's weights are drawn after the model's);
    # only the model is stored in bfloat16 at ``real``, the codec stays float32.
    model = random_model(
        HiggsAudioV2ForConditionalGeneration, config, seed=seed, device=device, bfloat16=size != "tiny"
    )
    with torch.device(device):
        codec: Any = HiggsAudioV2TokenizerModel(codec_config)
    if size == "tiny":
        # A random codebook of zeros (transformers' init of these buffers) decodes every
        # code alike: draw the codebooks, so each code sounds different.
        generator = torch.Generator().manual_seed(seed + 1)
        for quantizer in codec.quantizer.quantizers:
            embed = torch.randn(quantizer.codebook.embed.shape, generator=generator)
            quantizer.codebook.embed.copy_(embed)
            quantizer.codebook.embed_avg.copy_(embed)
    model.save_pretrained(out)
    codec_dir = out / AUDIO_TOKENIZER_DIR
    codec.save_pretrained(codec_dir)
    # The processor records where its audio tokenizer was loaded from: the codec written here.
    codec = HiggsAudioV2TokenizerModel.from_pretrained(codec_dir)
    build_processor(tokenizer, codec).save_pretrained(out)
    write_marker(out, "higgs-audio", size, seed)
    return out


def main(argv: list[str] | None = None) -> int:
    return writer_main(argv, doc=__doc__, sizes=SIZES, write=write_tiny_checkpoint, name="Higgs Audio v2")


if __name__ == "__main__":
    sys.exit(main())

"""A tiny random-weight causal LM with a byte-level tokenizer, built in memory.

For tests and benchmarks of the autoregressive machinery: the real transformers
architecture (Llama) and a real tokenizer, no download, built in milliseconds.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

EOS = "<eos>"


_PRINTABLE = [*range(32, 127), 10]  # printable ASCII and newline: every token decodes to itself
VOCAB_SIZE = len(_PRINTABLE) + 1
EOS_ID = len(_PRINTABLE)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (byte-level), plus ``<eos>``."""
    byte_chars: dict[int, str] = bytes_to_unicode()
    vocab = {byte_chars[byte]: index for index, byte in enumerate(_PRINTABLE)}
    vocab[EOS] = EOS_ID
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS)


def tiny_llama(seed: int = 0, *, hidden_size: int = 32, layers: int = 2, eos: bool = True) -> LlamaForCausalLM:
    """Random weights from ``seed``; ``eos=False`` gives a model that never stops by itself.

    The weights are drawn wider than transformers' default (0.02) so attention is peaked
    and the output really depends on the context and on positions: a test that gets
    masks or positions wrong then sees different tokens.
    """
    config = LlamaConfig(
        # Without an end token the output layer has no row for it, so it is never produced.
        vocab_size=VOCAB_SIZE if eos else VOCAB_SIZE - 1,
        initializer_range=0.3,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=None,
        pad_token_id=None,
        eos_token_id=EOS_ID if eos else None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.eval()
    return model

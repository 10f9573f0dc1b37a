"""What every family's random-weight checkpoint writer (``omnictl/models/*/tiny.py``) does alike.

Each writer trains a byte-level BPE tokenizer here on a few sentences of its own, builds its
model's config at a size, draws seeded random weights, saves, and has the same command line
(``python -m omnictl.models.FAMILY.tiny OUT_DIR [--seed N] [--size S] [--device D]``). What
differs stays in the family's writer: its special tokens, chat template, corpus, widths, the
tokenizer class its processor wants and anything it stores beside the weights.

The helpers here change nothing a writer stores: the same calls in the same order, so a
checkpoint written through them is byte for byte the one written before they existed (the
families' parity tests compare it with transformers'). Every family's writer uses them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any


def train_byte_level_bpe(
    corpus: Iterable[str],
    special_tokens: Iterable[str],
    *,
    vocab_size: int,
    byte_level_decoder: bool = False,
    unk_token: str | None = None,
    add_prefix_space: bool = False,
) -> Any:
    """A ``tokenizers.Tokenizer``: byte-level BPE trained on ``corpus`` twenty times over, with
    ``special_tokens`` first in the vocabulary (ids 0, 1, ... in their order).

    ``byte_level_decoder``: set the byte-level decoder, which ``PreTrainedTokenizerFast`` needs
    to decode; a ``Qwen2Tokenizer`` built from the vocabulary brings its own.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from tokenizers import decoders as tk_decoders

    bpe = Tokenizer(models.BPE(unk_token=unk_token) if unk_token is not None else models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    if byte_level_decoder:
        bpe.decoder = tk_decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(special_tokens),
        show_progress=False,
    )
    # Twenty times over: BPE needs a pair to recur before it merges it, and the corpora are a
    # handful of sentences.
    bpe.train_from_iterator(list(corpus) * 20, trainer=trainer)
    return bpe


def fast_tokenizer(bpe: Any, *, chat_template: str | None, **tokens: Any) -> Any:
    """A ``PreTrainedTokenizerFast`` over ``bpe`` (CSM's, Higgs Audio's: Llama-style tokenizers).

    ``tokens``: its ``bos_token``, ``eos_token``, ``pad_token``, ``extra_special_tokens``... and
    ``model_max_length``, passed as they are.
    """
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **tokens)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def qwen2_tokenizer(
    bpe: Any,
    *,
    special_tokens: Iterable[str],
    extra_special_tokens: Mapping[str, str],
    chat_template: str,
    plain_tokens: Iterable[str] = (),
) -> Any:
    """A ``Qwen2Tokenizer`` (the Qwen processors' class) from ``bpe``'s vocabulary and merges,
    ending with ``<|im_end|>`` and padding with ``<|endoftext|>`` as the released Qwen models do.

    ``special_tokens`` and ``plain_tokens`` are already in the vocabulary (trained as specials);
    registering them as added tokens keeps the BPE from splitting them apart. ``plain_tokens``
    are registered as not special, so decoding with ``skip_special_tokens`` keeps them.
    """
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    merges: Any = [tuple(pair) for pair in json.loads(bpe.to_str())["model"]["merges"]]  # pairs; typed as strings
    tokenizer = Qwen2Tokenizer(
        vocab=bpe.get_vocab(),
        merges=merges,
        extra_special_tokens=dict(extra_special_tokens),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=4096,
    )
    tokenizer.add_tokens([AddedToken(token, special=True) for token in special_tokens])
    plain = [AddedToken(token, special=False) for token in plain_tokens]
    if plain:
        tokenizer.add_tokens(plain)
    tokenizer.chat_template = chat_template
    return tokenizer


def token_id(tokenizer: Any, token: str, family: str) -> int:
    """The id of ``token``, which must be one entry of ``tokenizer``'s vocabulary."""
    ids = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(ids, int) or ids == tokenizer.unk_token_id:
        raise RuntimeError(f"{family} tokenizer: {token!r} is not one token")
    return ids


def check_size(size: str, sizes: Mapping[str, Any]) -> None:
    if size not in sizes:
        raise ValueError(f"size: {size!r} is not one of {', '.join(sizes)}")


def random_model(model_class: Any, config: Any, *, seed: int, device: str, bfloat16: bool) -> Any:
    """``model_class(config)`` with weights drawn after ``torch.manual_seed(seed)``, initialised on
    ``device`` (``cuda`` makes a real-size model quick), in bfloat16 when ``bfloat16`` (half the
    disk; the stages load float32)."""
    import torch

    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class(config)
    if bfloat16:
        model = model.to(torch.bfloat16)
    return model


def write_marker(out: Path, family: str, size: str, seed: int) -> None:
    """``omnictl-FAMILY.json``: the size and seed a checkpoint was written with."""
    (out / f"omnictl-{family}.json").write_text(json.dumps({"size": size, "seed": seed}) + "\n")


def writer_main(
    argv: list[str] | None,
    *,
    doc: str | None,
    sizes: Mapping[str, Any],
    write: Callable[..., Path],
    name: str,
) -> int:
    """The command line of a family's writer: ``OUT_DIR [--seed N] [--size S] [--device D]``;
    ``write`` is its ``write_tiny_checkpoint``, ``name`` the model's name in the last line."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("out_dir", help="directory to write the checkpoint into (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")
    parser.add_argument("--size", choices=sorted(sizes), default="tiny", help="widths and depths (default: tiny)")
    parser.add_argument("--device", default="cpu", help="where to initialise the weights (default: cpu)")
    args = parser.parse_args(argv)
    path = write(args.out_dir, seed=args.seed, size=args.size, device=args.device)
    sys.stdout.write(f"{args.size} {name} checkpoint written to {path}\n")
    return 0

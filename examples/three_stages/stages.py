"""Three plain-function stages: a tokenizer, a "model", a streaming detokenizer."""

from typing import Iterator

import torch

from omnictl.outputs import TextDelta, TextResult


def tokenize():
    def run(data: dict) -> dict:
        return {"ids": torch.tensor([ord(c) for c in data["text"]])}
    return run


def shout(repeat: int = 1):
    def run(data: dict) -> dict:
        return {"ids": data["ids"].repeat(repeat) - 32}  # lower -> upper case
    return run


def detokenize():
    # A generator: each yield is a stream chunk (sent to the client, since this stage
    # is terminal); the return value is the result. A `text` terminal streams TextDelta
    # and returns TextResult (see docs/adding-a-model.md).
    def run(data: dict) -> Iterator[TextDelta]:
        ids = data["ids"].tolist()
        for i in ids:
            yield TextDelta(text=chr(i))
        return TextResult(text="".join(map(chr, ids)), completion_tokens=len(ids))
    return run

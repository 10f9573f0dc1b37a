"""Three plain-function stages: a tokenizer, a "model", a streaming detokenizer."""

from typing import Iterator

import torch


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
    # is terminal); the return value is the result.
    def run(data: dict) -> Iterator[dict]:
        text = ""
        for i in data["ids"].tolist():
            text += chr(i)
            yield {"text": chr(i)}
        return {"text": text}
    return run

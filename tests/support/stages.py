"""Plain torch functions standing in for the omni models, for runtime tests.

They are real stages run by the real runtime; they just compute something small and
checkable instead of running a model. ``seen_log`` records which stage saw which request.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TextResult
from omnictl.schedulers.base import IncomingKind, OutgoingKind, OutgoingMessage, Scheduler, SchedulerLoad

if TYPE_CHECKING:
    import torch

# torch is imported where a stage makes tensors, not here: a stage process that runs only the
# plain stages below (crash_on, broken_factory, ...) then starts without it (~1.6 s CPU each).


def _log(log: str | None, stage: str, data: dict[str, Any]) -> None:
    if log:
        with open(log, "a") as fh:
            fh.write(f"{stage} {data.get('tag', '?')}\n")


def seen(log: str | Path) -> dict[str, set[str]]:
    """stage -> tags of the requests it ran."""
    result: dict[str, set[str]] = {}
    path = Path(log)
    if path.exists():
        for line in path.read_text().splitlines():
            stage, tag = line.split()
            result.setdefault(stage, set()).add(tag)
    return result


def preprocessing(log: str | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    import torch

    def run(data: dict[str, Any]) -> dict[str, Any]:
        _log(log, "preprocessing", data)
        ids = torch.tensor([ord(c) for c in data["text"]], dtype=torch.int64)
        return {"tag": data.get("tag"), "ids": ids, "audio": torch.ones(data.get("audio_len", 4))}

    return run


def encoder(name: str, log: str | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    import torch

    def run(data: dict[str, Any]) -> dict[str, Any]:
        _log(log, name, data)
        return {"tag": data.get("tag"), "emb": torch.full((2, 3), float(len(data["ids"])))}

    return run


def merge_embeddings(inputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    import torch

    pre = inputs["preprocessing"]
    embs = [inputs[k]["emb"] for k in sorted(inputs) if k != "preprocessing"]
    return {"tag": pre["tag"], "ids": pre["ids"], "emb": torch.cat(embs) if embs else torch.zeros(0, 3)}


def aggregate(log: str | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def run(data: dict[str, Any]) -> dict[str, Any]:
        _log(log, "mm_aggregate", data)
        return {"tag": data["tag"], "ids": data["ids"], "rows": int(data["emb"].shape[0])}

    return run


def thinker(steps: int = 4, log: str | None = None) -> Callable[[dict[str, Any]], Iterator[dict[str, Any]]]:
    import torch

    def run(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
        _log(log, "thinker", data)
        tokens = []
        for i in range(steps):
            token = int(data["ids"][i % len(data["ids"])])
            tokens.append(token)
            yield {"token": token, "hidden": torch.full((4,), float(i))}
        return {"tag": data["tag"], "tokens": tokens, "hidden": torch.arange(steps * 4.0).reshape(steps, 4)}

    return run


def drop_hidden(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != "hidden"}


def detokenize(log: str | None = None) -> Callable[[dict[str, Any]], Iterator[TextDelta]]:
    def run(data: dict[str, Any]) -> Iterator[TextDelta]:
        _log(log, "decode", data)
        assert "hidden" not in data, "projection should have dropped the hidden states"
        for token in data["tokens"]:
            yield TextDelta(text=chr(token))
        return TextResult(text="".join(chr(t) for t in data["tokens"]), completion_tokens=len(data["tokens"]))

    return run


def talker(log: str | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    import torch

    def run(data: dict[str, Any]) -> dict[str, Any]:
        _log(log, "talker_ar", data)
        return {"tag": data["tag"], "codes": (data["hidden"].sum(dim=1)).to(torch.int64)}

    return run


def vocoder(log: str | None = None) -> Callable[[dict[str, Any]], Iterator[AudioChunk]]:
    import torch

    def run(data: dict[str, Any]) -> Iterator[AudioChunk]:
        _log(log, "code2wav", data)
        chunks = []
        for code in data["codes"]:
            chunk = torch.full((8,), float(code)) / 100.0
            chunks.append(chunk)
            yield AudioChunk(samples=chunk, sample_rate=16000)
        return AudioResult(samples=torch.cat(chunks), sample_rate=16000)

    return run


class ChunkCollector(Scheduler):
    """A stream consumer: gathers the chunks an upstream streams to it and, when the
    upstream's data arrives, returns the chunks it got (in order) beside that data."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: dict[str, list[Any]] = {}

    async def run(self) -> None:
        while True:
            message = await self.inbox.get()
            if message.kind is IncomingKind.STREAM_CHUNK:
                self.chunks.setdefault(message.request_id, []).append(message.data)
            elif message.kind is IncomingKind.NEW_REQUEST:
                got = self.chunks.pop(message.request_id, [])
                tokens = [c["token"] for c in got]
                self.emit(OutgoingMessage(OutgoingKind.RESULT, message.request_id, {"streamed": tokens, **message.data}))

    def abort(self, request_id: str) -> None:
        self.chunks.pop(request_id, None)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad(stream_buffers=len(self.chunks))


def chunk_collector() -> ChunkCollector:
    return ChunkCollector()


def crash_on(word: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Kills its whole process when it sees ``word`` (a stage process dying mid-request)."""

    def run(data: dict[str, Any]) -> dict[str, Any]:
        if word in str(data.get("text", "")):
            os._exit(3)
        return data

    return run


def broken_factory() -> Any:
    raise RuntimeError("weights not found at /nowhere")


class Picky(Exception):
    """Pickles fine, fails to unpickle (its __init__ needs two arguments)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(a)
        self.b = b


def returns_picky() -> Callable[[dict[str, Any]], dict[str, Any]]:
    def run(data: dict[str, Any]) -> dict[str, Any]:
        if data.get("picky"):
            return {"error": Picky(1, 2)}
        return data

    return run


class UserThing:
    """An object of a user class: outside the typed wire encoding."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UserThing) and other.value == self.value


def returns_user_object() -> Callable[[dict[str, Any]], dict[str, Any]]:
    def run(data: dict[str, Any]) -> dict[str, Any]:
        return {"out": [1, {"thing": UserThing(data["value"])}]}

    return run


def returns_unpicklable() -> Callable[[dict[str, Any]], dict[str, Any]]:
    def run(data: dict[str, Any]) -> dict[str, Any]:
        if data.get("lambda"):
            return {"fn": lambda: None}
        return data

    return run


class StreamCounter(Scheduler):
    """Finishes on STREAM_DONE: a stage reached only through `stream_to`."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    async def run(self) -> None:
        while True:
            message = await self.inbox.get()
            if message.kind is IncomingKind.STREAM_CHUNK:
                self.counts[message.request_id] = self.counts.get(message.request_id, 0) + 1
            elif message.kind is IncomingKind.STREAM_DONE:
                count = self.counts.pop(message.request_id, 0)
                self.emit(OutgoingMessage(OutgoingKind.RESULT, message.request_id, {"chunks": count}))

    def abort(self, request_id: str) -> None:
        self.counts.pop(request_id, None)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad(stream_buffers=len(self.counts))


def stream_counter() -> StreamCounter:
    return StreamCounter()


def fails_once_after_marker(marker: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A factory that raises (once) while ``marker`` exists: a restart that fails."""
    if os.path.exists(marker):
        os.remove(marker)
        raise RuntimeError("transient start-up failure")
    return crash_on("die")


def hoarder(keep: int = 1000) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Keeps (up to ``keep``) every tensor it receives, as received (views of the sender's
    shm slot), and reports whether all of them still hold the value they arrived with."""
    held: list[tuple[float, torch.Tensor]] = []

    def run(data: dict[str, Any]) -> dict[str, Any]:
        if len(held) < keep:
            held.append((float(data["i"]), data["blob"]))
        intact = all(bool((t == value).all()) for value, t in held)
        return {"i": data["i"], "held": len(held), "intact": intact}

    return run

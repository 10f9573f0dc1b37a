"""A tiny Qwen3-ASR checkpoint (written once per session), clips, transformers' own answer,
and the served topology (one in-process ``omnictl serve`` for the session, shared by the
HTTP and the realtime modules)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Coroutine, Iterator, TypeVar

import numpy as np
import pytest

from omnictl.models.qwen3_asr.tiny import SAMPLE_RATE, write_tiny_checkpoint
from omnictl.serving.config import HttpConfig, ServeConfig
from omnictl.serving.server import Listening
from tests.models.conftest import one_thread
from tests.serving.harness import serving_in_process

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "qwen3-asr.yaml"
MAX_TOKENS = 16  # the served decoder's default here: random weights never stop on their own
T = TypeVar("T")


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """torch on one thread in this process, as each stage process runs (tests/models/conftest.py)."""
    with one_thread():
        yield


@pytest.fixture(scope="session")
def tiny_asr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-asr"))


def clip(seed: int = 1, seconds: float = 1.5) -> np.ndarray:
    """Noise with a tone in it: random weights hear anything, and each clip differently."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    noise = np.random.RandomState(seed).randn(t.size) * 0.05
    return (noise + 0.3 * np.sin(2 * np.pi * (200 + 100 * seed) * t)).astype(np.float32)


def request(audio: np.ndarray, *, max_tokens: int = 12, language: str | None = None, **extra: Any) -> dict[str, Any]:
    """The Python API's request: one user message holding the clip, greedy."""
    part = {"type": "input_audio", "input_audio": {"data": audio, "sample_rate": SAMPLE_RATE}}
    inputs: dict[str, Any] = {
        "messages": [{"role": "user", "content": [part]}],
        "sampling": {"temperature": 0, "max_tokens": max_tokens},
        **extra,
    }
    if language is not None:
        inputs["language"] = language
    return inputs


class Reference:
    """transformers' processor and model on the same checkpoint, loaded once."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(path)
        self.model = Qwen3ASRForConditionalGeneration.from_pretrained(path).eval()
        self.stop = set(self.model.generation_config.eos_token_id)

    def inputs(self, audio: np.ndarray, language: str | None = None, prompt: str | None = None) -> Any:
        return self.processor.apply_transcription_request(audio, language=language, prompt=prompt)

    def generate(
        self, audio: np.ndarray, *, max_tokens: int, language: str | None = None, prompt: str | None = None
    ) -> tuple[list[int], dict[str, Any]]:
        """Greedy ``generate``: the new token ids (an end token left out, as omnictl's) and
        the processor's reading of them (language, transcription)."""
        inputs = self.inputs(audio, language, prompt)
        with one_thread():
            out = self.model.generate(**inputs, do_sample=False, max_new_tokens=max_tokens)
        ids = out[0, inputs["input_ids"].shape[1] :].tolist()
        if ids and ids[-1] in self.stop:
            ids = ids[:-1]
        return ids, self.processor.decode(ids, return_format="parsed")


@pytest.fixture(scope="session")
def reference(tiny_asr: Path) -> Reference:
    return Reference(tiny_asr)


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the served topology records its traces."""
    return tmp_path_factory.mktemp("qwen3-asr-run")


@pytest.fixture(scope="session")
def served(tiny_asr: Path, run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listening]:
    """topologies/qwen3-asr.yaml as shipped but for the decoder's default ``max_tokens``
    (MAX_TOKENS), served in process: its pipeline is reached through the Python API too.
    Every test leaves it as found (nothing held)."""
    shipped = TOPOLOGY.read_text()
    assert "max_tokens: 256" in shipped
    topology = tmp_path_factory.mktemp("topology") / "qwen3-asr.yaml"
    topology.write_text(shipped.replace("max_tokens: 256", f"max_tokens: {MAX_TOKENS}"))
    config = ServeConfig(topology=str(topology), http=HttpConfig(port=0)).launching(
        model_path=str(tiny_asr), device="cpu", run_dir=run_dir
    )
    with serving_in_process(config, "in-process omnictl serve (qwen3-asr)") as listening:
        yield listening


def on_loop(served: Listening, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    assert served.loop is not None
    return asyncio.run_coroutine_threadsafe(coroutine, served.loop).result(timeout)

"""topologies/qwen3-omni-text.yaml with its thinker on vLLM (`engine: vllm`), served by a real
`omnictl serve` and asked over HTTP: greedy text equals transformers' own thinker, images are
refused naming `engine: hf`, a too-long prompt is a 400 naming the limit. One server (one
engine) for the module."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

pytest.importorskip("vllm", reason="needs the vllm extra (pip install -e '.[vllm]'; scripts/setup.sh installs it)")

from omnictl.models.qwen3_omni.tiny import write_tiny_checkpoint  # noqa: E402
from tests.serving.harness import ServerProcess, start_server, stop_server  # noqa: E402

from .conftest import png_data_url  # noqa: E402

# An engine start-up (~10-60 s on a loaded 2-core machine) in the fixture.
pytestmark = pytest.mark.timeout(600)

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "qwen3-omni-text.yaml"
MAX_MODEL_LEN = 256
MAX_TOKENS = 12
SYSTEM = "You are a helpful assistant."
QUESTIONS = (
    "What is the capital of France?",
    "Describe this image. Listen to this audio and answer the question.",
    "Hello, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # "tiny" has head size 16, below what vLLM's CPU attention runs.
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-vllm-qwen3-omni"), size="tiny_vllm")


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    topology = yaml.safe_load(TOPOLOGY.read_text())
    (thinker,) = [stage for stage in topology["stages"] if stage["name"] == "thinker"]
    assert thinker["factory_args"]["engine"] == "hf"  # shipped on hf: images and audio need it
    thinker["factory_args"] = {
        "engine": "vllm",
        "vllm": {"max_model_len": MAX_MODEL_LEN, "kv_cache_gib": 1, "max_num_seqs": 8, "enforce_eager": True},
    }
    path = tmp_path_factory.mktemp("topology") / "qwen3-omni-text-vllm.yaml"
    path.write_text(yaml.safe_dump(topology, sort_keys=False))
    running = start_server(str(path), "--model-path", str(checkpoint), "--device", "cpu", ready_timeout=420)
    yield running
    code = stop_server(running)
    assert code == 0, running.text()


def chat(server: ServerProcess, content: Any, max_tokens: int = MAX_TOKENS) -> httpx.Response:
    body = {
        "model": "qwen3-omni-text",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)


def transformers_answers(checkpoint: Path) -> dict[str, str]:
    """transformers' own Qwen3-Omni thinker, greedy, on the same chat template."""
    import torch
    from transformers import AutoTokenizer

    from omnictl.models.qwen3_omni.weights import load_config, load_thinker

    thinker = load_thinker(checkpoint, "cpu")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    end = load_config(checkpoint).im_end_token_id
    answers = {}
    for question in QUESTIONS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        ids = torch.tensor([tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)])
        out = thinker.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False,
            eos_token_id=end,
        )
        answers[question] = tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    return answers


def test_greedy_text_over_http_equals_transformers_thinker(server: ServerProcess, checkpoint: Path) -> None:
    expected = transformers_answers(checkpoint)
    problems = []
    for question in QUESTIONS:
        response = chat(server, question)
        assert response.status_code == 200, response.text
        got = response.json()["choices"][0]["message"]["content"]
        if got != expected[question]:
            first = next((i for i, (a, b) in enumerate(zip(got, expected[question])) if a != b), min(len(got), len(expected[question])))
            problems.append(f"{question!r}: vLLM {got!r} != transformers {expected[question]!r} (first difference at character {first})")
    assert not problems, "greedy answers differ:\n" + "\n".join(problems)
    assert sum(len(answer) for answer in expected.values()) > len(QUESTIONS) * 4  # real answers, not empty ones


def test_an_image_is_refused_naming_engine_hf(server: ServerProcess) -> None:
    response = chat(server, [{"type": "image_url", "image_url": {"url": png_data_url()}}, {"type": "text", "text": "Describe this image."}])
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "image" in message and "engine: hf" in message and "thinker" in message, message
    assert chat(server, QUESTIONS[0]).status_code == 200  # still serving


def test_a_prompt_longer_than_max_model_len_is_a_400_naming_the_limit(server: ServerProcess) -> None:
    response = chat(server, "The quick brown fox jumps over the lazy dog. " * 40)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert f"max_model_len is {MAX_MODEL_LEN}" in message and "stage thinker" in message, message
    assert chat(server, QUESTIONS[0]).status_code == 200

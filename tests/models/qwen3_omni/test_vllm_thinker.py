"""Qwen3-Omni's thinker on vLLM (`engine: vllm`), served by a real `omnictl serve` and asked
over HTTP: greedy text equals transformers' own thinker, streamed text comes in order and adds
up, a spoken answer comes out of the talker, images are refused naming `engine: hf`, a
too-long prompt is a 400 naming the limit.

One server (one engine) for the module, on topologies/qwen3-omni.yaml: its text path is
qwen3-omni-text.yaml's (the same front end, thinker and decode), and it has the talker too."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

pytest.importorskip("vllm", reason="needs the vllm extra (pip install -e '.[vllm]'; scripts/setup.sh installs it)")

from omnictl.models.qwen3_omni.tiny import write_tiny_checkpoint
from tests.serving.harness import ServerProcess, start_server, stop_server

from .conftest import png_data_url

# An engine start-up (~10-60 s on a loaded 2-core machine) in the fixture.
pytestmark = pytest.mark.timeout(600)

TOPOLOGIES = Path(__file__).resolve().parents[3] / "topologies"
MAX_MODEL_LEN = 256
MAX_CODES = 10  # a random talker rarely says end-of-speech: bound the audio
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
    topology = yaml.safe_load((TOPOLOGIES / "qwen3-omni.yaml").read_text())
    stages = {stage["name"]: stage for stage in topology["stages"]}
    text_only = {stage["name"]: stage for stage in yaml.safe_load((TOPOLOGIES / "qwen3-omni-text.yaml").read_text())["stages"]}
    for name in ("preprocessing", "mm_aggregate", "decode"):
        assert text_only[name] == stages[name]  # so this server tests qwen3-omni-text's text path too
    assert text_only["thinker"]["factory"] == stages["thinker"]["factory"]
    assert text_only["thinker"]["factory_args"]["engine"] == "hf"  # shipped on hf: images and audio need it
    stages["thinker"]["factory_args"] = {
        "engine": "vllm",
        "vllm": {"max_model_len": MAX_MODEL_LEN, "kv_cache_gib": 1, "max_num_seqs": 8, "enforce_eager": True},
    }
    stages["talker_ar"]["factory_args"] = {"max_codes": MAX_CODES}
    path = tmp_path_factory.mktemp("topology") / "qwen3-omni-vllm.yaml"
    path.write_text(yaml.safe_dump(topology, sort_keys=False))
    running = start_server(str(path), "--model-path", str(checkpoint), "--device", "cpu", ready_timeout=420)
    yield running
    code = stop_server(running)
    assert code == 0, running.text()


def chat(server: ServerProcess, content: Any, max_tokens: int = MAX_TOKENS, **extra: Any) -> httpx.Response:
    body = {
        **extra,
        "model": "qwen3-omni",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)


def transformers_answers(checkpoint: Path) -> tuple[Any, dict[str, list[int]]]:
    """transformers' own Qwen3-Omni thinker, greedy, on the same chat template: its tokenizer
    and each question's answer token ids."""
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
        answers[question] = [t for t in out[0, ids.shape[1]:].tolist() if t != end]
    return tokenizer, answers


def first_difference(tokenizer: Any, expected: list[int], got: str) -> str:
    """The first of transformers' tokens that the served text does not continue with."""
    for index in range(len(expected)):
        if not got.startswith(tokenizer.decode(expected[: index + 1], skip_special_tokens=True)):
            token = expected[index]
            return (f"token {index}: transformers {token} {tokenizer.decode([token])!r}, "
                    f"vLLM's text goes on {got[len(tokenizer.decode(expected[:index])):][:20]!r}")
    return f"vLLM's text is longer: {got!r}"


def test_greedy_text_over_http_equals_transformers_thinker(server: ServerProcess, checkpoint: Path) -> None:
    tokenizer, expected = transformers_answers(checkpoint)
    problems = []
    for question in QUESTIONS:
        response = chat(server, question)
        assert response.status_code == 200, response.text
        got = response.json()["choices"][0]["message"]["content"]
        if got != tokenizer.decode(expected[question], skip_special_tokens=True):
            problems.append(f"{question!r}: {first_difference(tokenizer, expected[question], got)}")
    assert not problems, "greedy answers differ:\n" + "\n".join(problems)
    assert sum(len(answer) for answer in expected.values()) > len(QUESTIONS) * 4  # real answers, not empty ones


def test_streamed_text_arrives_in_order_and_adds_up_to_the_answer(server: ServerProcess) -> None:
    body = {"model": "qwen3-omni", "stream": True, "temperature": 0, "max_tokens": MAX_TOKENS,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]}
    pieces: list[str] = []
    finish = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: "):])["choices"][0]
            pieces.append(choice["delta"].get("content") or "")
            finish.append(choice.get("finish_reason"))
    assert sum(1 for piece in pieces if piece) >= 3  # token by token, not one lump
    assert finish[-1] is not None and not any(finish[:-1])  # the end comes after every piece of text
    assert "".join(pieces) == chat(server, QUESTIONS[0]).json()["choices"][0]["message"]["content"]


def test_a_spoken_answer_comes_from_the_talker_with_the_same_text(server: ServerProcess) -> None:
    spoken = chat(server, QUESTIONS[0], modalities=["text", "audio"], audio={"format": "wav"})
    assert spoken.status_code == 200, spoken.text
    message = spoken.json()["choices"][0]["message"]
    assert len(base64.b64decode(message["audio"]["data"])) > 44  # a WAV header and samples
    assert message["content"] == chat(server, QUESTIONS[0]).json()["choices"][0]["message"]["content"]


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

"""The vLLM thinker in a real pipeline (stage processes, ZeroMQ): a too-long prompt is the
client's error naming the limit; a killed engine fails its requests naming the stage and
the restart policy brings the stage back."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

pytest.importorskip("vllm", reason="needs the vllm extra (pip install -e '.[vllm]'; scripts/setup.sh installs it)")
import psutil

import omnictl
from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.wait import until

# Two engine start-ups (the first and the restarted one) on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # vLLM engines and the real models

VA = "omnictl.models.voice_assistant.stages"
MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def pipe(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    engine = {"max_model_len": MAX_MODEL_LEN, "kv_cache_gib": 1, "max_num_seqs": 8, "enforce_eager": True}
    path = topo.write(
        tmp_path_factory.mktemp("vllm") / "vllm-thinker.yaml",
        [
            {"name": "thinker", "factory": f"{VA}.thinker", "process": "llm",
             "factory_args": {"engine": "vllm", "max_tokens": 16, "temperature": 0.0, "vllm": engine},
             "next": ["decode"], "stream_to": ["decode"]},
            {"name": "decode", "factory": f"{VA}.decode", "process": "llm", "terminal": True, "modality": "text"},
        ],
    )
    pipeline = launch(loop, path, profile=False, max_restarts=1, ready_timeout=600.0)
    yield pipeline
    loop.run(pipeline.close(), timeout=120)


def engine_cores(pipe: Any) -> list[psutil.Process]:
    """vLLM's engine core processes under this pipeline's thinker stage process (not the other
    pipelines this process may hold: the package's shared voice assistant has one of its own)."""
    found = []
    try:
        children = psutil.Process(pipe.process_ids()["llm"]).children(recursive=True)
    except (KeyError, psutil.NoSuchProcess):  # the llm process is down, or being started again
        return []
    for child in children:
        try:
            if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


async def answer(pipe: Any, question: str, **sampling: Any) -> str:
    handle = await pipe.submit({"messages": [{"role": "user", "content": question}], "sampling": sampling})
    result = await handle.result()
    return str(result["decode"].text)


def test_a_prompt_longer_than_max_model_len_fails_as_the_clients_error_naming_the_limit(loop: LoopThread, pipe: Any) -> None:
    with pytest.raises(omnictl.RequestFailed) as failure:
        loop.run(answer(pipe, "word " * 400), timeout=120)
    assert failure.value.field == "messages"  # the HTTP layer answers 400 naming it
    assert f"max_model_len is {MAX_MODEL_LEN}" in str(failure.value) and "stage thinker" in str(failure.value)
    assert "Paris" in loop.run(answer(pipe, "What is the capital of France?"), timeout=300)  # still serving


def test_a_killed_engine_fails_its_requests_naming_the_stage_and_the_restart_serves_again(loop: LoopThread, pipe: Any) -> None:
    cores = engine_cores(pipe)
    assert len(cores) == 1, f"expected one vLLM engine core, found {[c.pid for c in cores]}"

    async def long_answer() -> Any:
        return await pipe.submit({"messages": [{"role": "user", "content": "Write a long story about a dragon."}],
                                  "sampling": {"max_tokens": 240, "temperature": 0.0}})

    handles = [loop.run(long_answer()) for _ in range(3)]
    time.sleep(1.0)  # they are in the engine now
    cores[0].kill()
    for handle in handles:
        with pytest.raises(omnictl.RequestFailed) as failure:
            loop.run(handle.result(), timeout=300)
        message = str(failure.value)
        assert "thinker" in message, message
        assert "stage thinker: the vLLM engine died" in message, message
    assert until(lambda: pipe.healthy and len(engine_cores(pipe)) == 1, timeout=900, interval=1.0)
    assert engine_cores(pipe)[0].pid != cores[0].pid
    assert "Paris" in loop.run(answer(pipe, "What is the capital of France?"), timeout=300)

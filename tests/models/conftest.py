"""What the model families' tests share: torch on one thread in the test process, and the
tiny Moshi checkpoint (Mimi's tests and Moshi's both run on it: one write per session).

A family's tests compare the served topology with transformers' own model run in the test
process (its greedy ``generate``, its codec's decode). torch's default there is a thread a
core; on a 2-core machine with other work beside it (the suite's stage processes, a busy
CI host) two threads of small ops spin at each other's barriers: transformers'
Qwen2.5-Omni ``generate`` took 86 s of wall time with two threads and 3 s with one, at a
load of 15 to 28. The stage processes already run one thread each (the launcher's
``OMP_NUM_THREADS`` split): :func:`one_thread` gives the reference the same, and each
family's conftest applies it to its modules (``autouse``) and to its session-scoped
references, which are set up before a module's fixtures."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads at one for the block, then as they were."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_moshi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Moshi checkpoint (``python -m omnictl.models.moshi.tiny``), for tests/models/mimi and tests/models/moshi."""
    from omnictl.models.moshi.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-moshi"))

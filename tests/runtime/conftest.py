from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.loop import LoopThread


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()

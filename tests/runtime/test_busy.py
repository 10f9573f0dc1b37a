"""A stage stuck in one long compute step still answers, and says for how long it has been busy."""

from __future__ import annotations

import time
from pathlib import Path

from omnictl.serving.app import HEALTH_STATS_TIMEOUT_S, busy_stages
from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.wait import until


def test_a_long_step_shows_as_busy_seconds_while_the_process_still_answers(loop: LoopThread, tmp_path: Path) -> None:
    path = topo.write(tmp_path / "stuck.yaml", [{"name": "stuck", "factory": "omnictl.models.examples.sleep",
                                                 "factory_args": {"seconds": 2.5}, "terminal": True}])
    pipe = launch(loop, path, profile=False)
    try:
        handle = loop.run(pipe.submit({"x": 1}))
        time.sleep(1.2)
        stats = loop.run(pipe.stats(HEALTH_STATS_TIMEOUT_S))
        assert stats["stuck"]["status"] == "up"  # not unresponsive: its IO loop is free
        assert 1.0 <= stats["stuck"]["busy_s"] < 2.5, stats["stuck"]
        assert list(busy_stages(stats, threshold=1.0)) == ["stuck"] and busy_stages(stats) == {}
        loop.run(handle.result())
        # the result leaves from inside the step; the worker thread ends it just after
        assert until(lambda: loop.run(pipe.stats())["stuck"]["busy_s"] == 0.0, timeout=5)
    finally:
        loop.run(pipe.close())

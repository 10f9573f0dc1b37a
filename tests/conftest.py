"""Suite-wide: profiling runs go to a temporary state directory, never the user's own
(default runs are pruned to the newest ten, which would discard a user's real traces)."""

from __future__ import annotations

import os
from typing import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    previous = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield
    if previous is None:
        del os.environ["XDG_STATE_HOME"]
    else:
        os.environ["XDG_STATE_HOME"] = previous


# Fixtures that start the real voice assistant (Whisper, SmolLM2, Piper): a test using one,
# directly or through another fixture, runs the demo models end to end, so it is `slow`.
REAL_MODEL_FIXTURES = frozenset({"voice_server", "whisper"})


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the tests on a real-model fixture ``slow``; ``OMNICTL_SKIP_SLOW=1`` skips every
    ``slow`` test, as ``-m "not slow"`` deselects them."""
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if os.environ.get("OMNICTL_SKIP_SLOW") != "1":
        return
    skip = pytest.mark.skip(reason="OMNICTL_SKIP_SLOW=1: a slow end-to-end test")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

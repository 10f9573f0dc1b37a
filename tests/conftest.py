"""Suite-wide: profiling runs go to a temporary state directory, never the user's own
(default runs are pruned to the newest ten, which would discard a user's real traces); and
which tests are ``slow`` (left out of the fast subset, ``-m "not slow"``)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Generator, Iterator

import pytest

# Bytecode caches on, even where the environment turns them off (PYTHONDONTWRITEBYTECODE=1,
# as on these machines): the suite starts hundreds of interpreters (servers, stage processes,
# engines), and each would compile omnictl from source again — ~1 s of CPU each (importing
# the stage worker and the server: 1.6-2.4 s without caches, 0.8 s with, measured
# 2026-12-08) — and pytest would rewrite every test module's asserts on every run. The caches
# go to __pycache__/ (git-ignored). Set here, before any test module is imported, and in the
# environment every child inherits.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True, scope="session")
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    previous = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield
    if previous is None:
        del os.environ["XDG_STATE_HOME"]
    else:
        os.environ["XDG_STATE_HOME"] = previous


@pytest.fixture(scope="session")
def fast_server() -> Iterator[Any]:
    """One `omnictl serve` of the fast topology (tests/serving/fast.yaml: plain functions in
    two stage processes) for the whole run, with an API key and small limits so that 413 is
    cheap to provoke: every test that only sends requests shares it (tests/serving's
    ``server``, the bench's), where each module started its own. Ctrl-C must shut it down
    cleanly at the end."""
    from tests.serving.harness import API_KEY, FAST_TOPOLOGY, start_server, stop_server

    running = start_server(str(FAST_TOPOLOGY), "--api-key", API_KEY, "--max-body-mb", "0.25",
                           "--max-audio-mb", "0.05", "--body-timeout", "2")
    yield running
    code = stop_server(running)
    assert code == 0, running.text()
    assert "omnictl serve: stopped" in running.text()


# Fixtures that start the real voice assistant (Whisper, SmolLM2, Piper): a test using one,
# directly or through another fixture, runs the demo models end to end, so it is `slow`.
REAL_MODEL_FIXTURES = frozenset({"voice_server", "whisper"})

# The measured rule: a test whose own time was over SLOW_THRESHOLD_S is listed in SLOW_LIST
# and marked `slow`, so the fast subset stays a few minutes however many such tests there
# are. "Own time" is its setup and call, less the setup of the module-, class- or
# session-scoped fixtures it happened to be the first to use: a server shared by a module's
# tests is paid once, and charging it to whichever test runs first would list that test,
# then the next one, and so on. Such a shared fixture is listed itself when its setup was
# over SHARED_SLOW_THRESHOLD_S (a real model loaded, a cluster started), and every test on
# it is `slow`. `--measure-slow` re-measures and rewrites the list (see CONTRIBUTING.md).
SLOW_THRESHOLD_S = 1.0
SHARED_SLOW_THRESHOLD_S = 5.0
SLOW_LIST = Path(__file__).with_name("slow_tests.txt")
_FIXTURE = "fixture "  # a SLOW_LIST line naming a shared fixture: "fixture <where defined>::<name>"
_HEADER = """\
# Marked `slow` by tests/conftest.py: the tests measured over {test:g} s each (setup and call,
# less the shared fixtures they were the first to use), and the shared fixtures whose setup
# took over {shared:g} s (every test on one). Written by
#   .venv/bin/python -m pytest -q -m "not slow" --measure-slow [paths]
# which also runs what is listed here and rewrites the entries for what it ran.
"""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--measure-slow", action="store_true",
        help=f"run the tests listed in {SLOW_LIST.name} too, and rewrite its entries for the tests run: "
             f"those over {SLOW_THRESHOLD_S:g} s of their own",
    )


def _listed() -> set[str]:
    if not SLOW_LIST.exists():
        return set()
    lines = (line.strip() for line in SLOW_LIST.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks ``slow`` the tests on a real-model fixture and those in SLOW_LIST (unless
    ``--measure-slow``); ``OMNICTL_SKIP_SLOW=1`` skips every ``slow`` test, as
    ``-m "not slow"`` deselects them."""
    listed = set() if config.getoption("measure_slow") else _listed()
    fixtures = [entry.removeprefix(_FIXTURE).rpartition("::") for entry in listed if entry.startswith(_FIXTURE)]
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        on_a_listed_fixture = any(name in names and item.nodeid.startswith(where) for where, _, name in fixtures)
        if REAL_MODEL_FIXTURES & names or item.nodeid in listed or on_a_listed_fixture:
            item.add_marker(pytest.mark.slow)
    if os.environ.get("OMNICTL_SKIP_SLOW") != "1":
        return
    skip = pytest.mark.skip(reason="OMNICTL_SKIP_SLOW=1: a slow end-to-end test")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# --- --measure-slow: each test's own time -------------------------------------------------

_own: dict[str, float] = {}  # node id -> seconds of its own
_shared: dict[str, float] = {}  # "fixture <where>::<name>" -> seconds its setup took
_shared_setup = {"depth": 0, "seconds": 0.0}  # the shared fixtures set up for the running test


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> Generator[None, None, None]:
    if fixturedef.scope == "function":
        yield
        return
    _shared_setup["depth"] += 1
    started = time.perf_counter()
    try:
        yield
    finally:
        _shared_setup["depth"] -= 1
        elapsed = time.perf_counter() - started
        key = f"{_FIXTURE}{fixturedef.baseid}::{fixturedef.argname}"
        _shared[key] = max(_shared.get(key, 0.0), elapsed)  # (its own shared dependencies inside)
        if _shared_setup["depth"] == 0:  # a shared fixture's own shared dependencies are inside it
            _shared_setup["seconds"] += elapsed


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "setup":
        _own[report.nodeid] = max(0.0, report.duration - _shared_setup["seconds"])
        _shared_setup["seconds"] = 0.0
    elif report.when == "call":
        _own[report.nodeid] = _own.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not session.config.getoption("measure_slow") or not _own:
        return
    kept = _listed() - set(_own) - set(_shared)
    measured = {nodeid for nodeid, seconds in _own.items() if seconds > SLOW_THRESHOLD_S}
    measured |= {key for key, seconds in _shared.items() if seconds > SHARED_SLOW_THRESHOLD_S}
    body = "".join(f"{entry}\n" for entry in sorted(kept | measured))
    SLOW_LIST.write_text(_HEADER.format(test=SLOW_THRESHOLD_S, shared=SHARED_SLOW_THRESHOLD_S) + body)

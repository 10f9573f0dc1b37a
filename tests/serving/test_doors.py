"""Doors (issue 13, item 6): the key, what it guards, and who can read the IPC files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.serving.harness import API_KEY, REPO, ServerProcess

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_the_key_is_never_printed(server: ServerProcess) -> None:
    assert "listening on" in server.text()
    assert API_KEY not in server.text()
    assert "$OMNICTL_API_KEY" in server.text()  # the example command reads it from the environment


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("GET", "/metrics"),
                                              ("POST", "/v1/chat/completions"), ("POST", "/v1/requests/x/abort")])
def test_every_route_but_health_is_behind_the_key(server: ServerProcess, method: str, path: str) -> None:
    response = httpx.request(method, server.url + path, timeout=10, json={})
    assert response.status_code == 401
    assert httpx.request(method, server.url + path, timeout=10, json={}, headers=AUTH).status_code != 401
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "omnictl.cli.main", "serve", "tests/serving/fast.yaml", "--port", "0", "--no-dashboard", *args]
    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "env"), [(("--api-key", ""), {}), (("--api-key", "  "), {}), ((), {"OMNICTL_API_KEY": ""})],
                         ids=["empty-flag", "blank-flag", "empty-env"])
def test_an_empty_key_is_refused_not_treated_as_none(args: tuple[str, ...], env: dict[str, str]) -> None:
    done = _serve(*args, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "API key is empty" in done.stderr and "listening on" not in done.stdout


def test_the_socket_directory_is_owner_only(server: ServerProcess) -> None:
    assert httpx.get(server.url + "/health", headers=AUTH, timeout=10).json()["processes"]
    dirs = {Path(p).parent for p in Path("/tmp").glob("omnictl-*/control")}
    assert dirs, "no socket directory found"
    for directory in dirs:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory


def test_shared_memory_segments_are_owner_only() -> None:
    from omnictl.transports.shm import SlotPool

    pool = SlotPool("p", "stage", slot_bytes=1024, slots=2)
    try:
        refs = []
        for nbytes in (10, 10_000):  # a slot of the pool's segment; a segment of its own
            ref, view = pool.acquire(nbytes)
            view.release()
            refs.append(ref)
        for ref in refs:
            assert stat.S_IMODE(os.stat(f"/dev/shm/{ref.segment}").st_mode) == 0o600
    finally:
        pool.close()

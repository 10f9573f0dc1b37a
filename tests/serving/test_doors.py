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


def test_an_empty_key_is_refused_not_treated_as_none() -> None:
    """The real command, from the environment (the flags: the test below)."""
    done = _serve(env={"OMNICTL_API_KEY": ""})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "API key is empty" in done.stderr and "listening on" not in done.stdout


@pytest.mark.timeout(60)  # were the key taken, the command would serve here until stopped
@pytest.mark.parametrize("key", ["", "  "], ids=["empty-flag", "blank-flag"])
def test_an_empty_key_flag_is_refused_not_treated_as_none(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``omnictl serve --api-key KEY`` in this process (a fresh interpreter costs a second of
    imports): the real command and server start-up, this process's logging left alone."""
    import typer
    from typer.testing import CliRunner

    from omnictl import logs
    from omnictl.cli.serve import register

    monkeypatch.setattr(logs, "configure", lambda level, format: None)
    monkeypatch.delenv("OMNICTL_API_KEY", raising=False)
    app = typer.Typer()

    @app.callback()
    def main() -> None:  # keeps `serve` a subcommand, as in `omnictl`
        """omnictl"""

    register(app)
    result = CliRunner().invoke(app, ["serve", "tests/serving/fast.yaml", "--port", "0", "--no-dashboard",
                                      "--api-key", key])
    assert result.exit_code == 1, result.output
    assert "API key is empty" in result.output and "listening on" not in result.output


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

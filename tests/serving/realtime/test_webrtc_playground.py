"""The playground in headless Chromium over WebRTC: a fake microphone speaks a question on the
page's audio track, the page shows what was heard and the answer, and says it talks WebRTC;
the peer connection runs on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.serving.browser import chromium, hands_free_turn
from tests.serving.harness import API_KEY, ServerProcess, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    # ICE on loopback: Chromium gathers 127.0.0.1 only when told to, and then as an address, not an mDNS name
    with chromium(tmp_path, "--allow-loopback-in-peer-connection", "--disable-features=WebRtcHideLocalIpsWithMdns") as driver:
        yield driver


SELECTED_PAIR = """
const done = arguments[arguments.length - 1];
pc.getStats().then((stats) => {
  const all = [...stats.values()];
  const pair = all.find((s) => s.type === "candidate-pair" && s.state === "succeeded" && s.nominated);
  if (!pair) return done(null);
  const local = stats.get(pair.localCandidateId), remote = stats.get(pair.remoteCandidateId);
  done({local: local.address || local.ip, remote: remote.address || remote.ip, port: remote.port});
});
"""


def test_the_playground_talks_webrtc_and_shows_the_question_and_the_answer(voice_server: ServerProcess,
                                                                           browser: webdriver.Chrome, tmp_path: Path) -> None:
    browser.get(f"{voice_server.url}/?key={API_KEY}")
    wait = WebDriverWait(browser, 150, poll_frequency=0.2)
    try:
        wait.until(lambda d: "connected to" in d.find_element(By.ID, "status").text)
        assert browser.find_element(By.ID, "transport").text == "over WebRTC"
        assert httpx.get(voice_server.url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).json()["realtime"]["peer_connections"] == 1
        pair: dict[str, Any] | None = wait.until(lambda d: d.execute_async_script(SELECTED_PAIR))
        assert pair is not None and pair["remote"] == "127.0.0.1", pair  # the media and events stay on loopback
        hands_free_turn(browser, wait)
        call = browser.execute_script("return call.url").rsplit("/", 1)[-1]
        # Leaving the page hangs up: the server need not wait to see the connection gone. The
        # page posts the hang-up and closes its peer connection at once, so the data channel's
        # close may reach the server first: either ends the call at once, where a browser that
        # just vanished would hold it until the connection's consent checks fail (~30 s).
        browser.get("about:blank")
        ends = [f"realtime call {call} ended: {why}" for why in ("hung up by the client", "the data channel closed")]
        wait_until(lambda: any(end in voice_server.text() for end in ends), timeout=10)
    except (TimeoutException, AssertionError):
        shot = tmp_path / "playground-webrtc-failure.png"
        browser.save_screenshot(str(shot))
        print(f"playground screenshot: {shot}\nbrowser log: {browser.get_log('browser')}")
        raise


def test_the_websocket_is_used_when_asked_for(voice_server: ServerProcess, browser: webdriver.Chrome) -> None:
    browser.get(f"{voice_server.url}/?key={API_KEY}&transport=websocket")
    WebDriverWait(browser, 60, poll_frequency=0.2).until(lambda d: "connected to" in d.find_element(By.ID, "status").text)
    assert browser.find_element(By.ID, "transport").text == "over WebSocket"
    assert browser.execute_script("return pc") is None

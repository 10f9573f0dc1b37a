"""The playground in headless Chromium over WebRTC: a fake microphone speaks a question on the
page's audio track, the page shows what was heard and the answer, and says it talks WebRTC;
the peer connection runs on 127.0.0.1."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from benchmarks.eval.samples import sample_question, wav_bytes
from tests.serving.harness import API_KEY, ServerProcess

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    if CHROMIUM is None or DRIVER is None:
        raise AssertionError("chromium and chromium-driver are needed (apt-get install chromium chromium-driver; .ci/run does)")
    speech, rate = sample_question("spider_legs")
    pad = np.zeros(rate, dtype=np.float32)
    question = tmp_path / "question.wav"
    question.write_bytes(wav_bytes(np.concatenate([pad, speech, pad, pad, pad]), rate))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--use-fake-ui-for-media-stream",
                 "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={question}%noloop",
                 "--autoplay-policy=no-user-gesture-required", f"--user-data-dir={tmp_path / 'profile'}",
                 # ICE on loopback: Chromium gathers 127.0.0.1 only when told to, and then as an address, not an mDNS name
                 "--allow-loopback-in-peer-connection", "--disable-features=WebRtcHideLocalIpsWithMdns"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


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
        assert httpx.get(voice_server.url + "/health", timeout=10).json()["realtime"]["peer_connections"] == 1
        pair: dict[str, Any] | None = wait.until(lambda d: d.execute_async_script(SELECTED_PAIR))
        assert pair is not None and pair["remote"] == "127.0.0.1", pair  # the media and events stay on loopback
        browser.find_element(By.ID, "handsfree").click()  # the fake microphone starts playing the recording
        wait.until(lambda d: any("spider" in e.text.lower() for e in d.find_elements(By.CSS_SELECTOR, ".turn.user")))
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '.turn.assistant[data-status="completed"]'))
        wait.until(lambda d: float(d.find_element(By.TAG_NAME, "body").get_attribute("data-audio-played") or 0) > 0.5)
        answer = browser.find_element(By.CSS_SELECTOR, ".turn.assistant .text").text
        assert len(answer.split()) >= 3, answer
        latency = browser.find_element(By.ID, "latency").text
        assert latency.endswith(" ms") and 0 < int(latency.split()[0]) < 60_000, latency
        assert not browser.find_elements(By.CSS_SELECTOR, ".error")
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

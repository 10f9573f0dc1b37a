"""The playground page in a real browser: Debian's chromium, headless, with a fake microphone
that speaks a question; the page must show what was heard, an answer, and play its audio."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

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

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
# Set to save a picture of the page after a good run (how docs/playground.png is made).
SCREENSHOT = os.environ.get("OMNICTL_PLAYGROUND_SCREENSHOT")


@pytest.fixture()
def spoken_question(tmp_path: Path) -> Path:
    """A fake microphone's recording: silence, "How many legs does a spider have?", silence."""
    speech, rate = sample_question("spider_legs")
    pad = np.zeros(rate, dtype=np.float32)
    path = tmp_path / "question.wav"
    path.write_bytes(wav_bytes(np.concatenate([pad, speech, pad, pad, pad]), rate))
    return path


@pytest.fixture()
def browser(spoken_question: Path, tmp_path: Path) -> Iterator[webdriver.Chrome]:
    if CHROMIUM is None or DRIVER is None:
        raise AssertionError("chromium and chromium-driver are needed (apt-get install chromium chromium-driver; .ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--use-fake-ui-for-media-stream",
                 "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={spoken_question}%noloop",
                 "--autoplay-policy=no-user-gesture-required", "--window-size=1000,760", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def test_the_page_is_static_and_served_at_the_root(voice_server: ServerProcess) -> None:
    page = httpx.get(voice_server.url + "/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/v1/realtime" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing fetched from elsewhere
    assert "playground at " + voice_server.url + "/" in voice_server.text()  # serve prints where it is


def test_hands_free_question_is_heard_answered_and_played(voice_server: ServerProcess, browser: webdriver.Chrome,
                                                          tmp_path: Path) -> None:
    browser.get(f"{voice_server.url}/?key={API_KEY}")
    wait = WebDriverWait(browser, 120, poll_frequency=0.2)
    try:
        wait.until(lambda d: "connected to" in d.find_element(By.ID, "status").text)
        browser.find_element(By.ID, "handsfree").click()  # the microphone starts playing the recording
        wait.until(lambda d: any("spider" in e.text.lower() for e in d.find_elements(By.CSS_SELECTOR, ".turn.user")))
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '.turn.assistant[data-status="completed"]'))
        wait.until(lambda d: float(d.find_element(By.TAG_NAME, "body").get_attribute("data-audio-played") or 0) > 0.5)
        answer = browser.find_element(By.CSS_SELECTOR, ".turn.assistant .text").text
        assert len(answer.split()) >= 3
        latency = browser.find_element(By.ID, "latency").text
        assert latency.endswith(" ms") and 0 < int(latency.split()[0]) < 60_000, latency
        assert not browser.find_elements(By.CSS_SELECTOR, ".error")
    except (TimeoutException, AssertionError):
        shot = tmp_path / "playground-failure.png"
        browser.save_screenshot(str(shot))
        print(f"playground screenshot: {shot}\nbrowser log: {browser.get_log('browser')}")
        raise
    if SCREENSHOT:
        browser.save_screenshot(SCREENSHOT)


def test_a_typed_question_is_timed_from_when_it_was_sent(voice_server: ServerProcess, browser: webdriver.Chrome,
                                                         tmp_path: Path) -> None:
    browser.get(f"{voice_server.url}/?key={API_KEY}")
    wait = WebDriverWait(browser, 120, poll_frequency=0.2)
    try:
        wait.until(lambda d: "connected to" in d.find_element(By.ID, "status").text)
        browser.find_element(By.ID, "text").send_keys("What is the capital of France?\n")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '.turn.assistant[data-status="completed"]'))
        wait.until(lambda d: browser.find_element(By.ID, "latency").text.endswith(" ms"))
        # no speech ended: the figure is labelled for what it measures
        assert browser.find_element(By.ID, "latency-label").text == "question sent → first audio"
        meta = browser.find_element(By.CSS_SELECTOR, ".turn.assistant .meta").text
        assert meta.startswith("question sent → first audio: ") and "end of speech" not in meta
    except (TimeoutException, AssertionError):
        shot = tmp_path / "playground-typed-failure.png"
        browser.save_screenshot(str(shot))
        print(f"playground screenshot: {shot}\nbrowser log: {browser.get_log('browser')}")
        raise

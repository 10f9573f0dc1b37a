"""Headless Chromium on the playground, with a fake microphone playing a packaged question:
the browser both playground tests (WebSocket and WebRTC) open, and the hands-free turn they check."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from benchmarks.eval.samples import sample_question, wav_bytes

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def spoken_question(directory: Path) -> Path:
    """A fake microphone's recording: silence, "How many legs does a spider have?", silence."""
    speech, rate = sample_question("spider_legs")
    pad = np.zeros(rate, dtype=np.float32)
    path = directory / "question.wav"
    path.write_bytes(wav_bytes(np.concatenate([pad, speech, pad, pad, pad]), rate))
    return path


@contextlib.contextmanager
def chromium(tmp_path: Path, *flags: str) -> Iterator[webdriver.Chrome]:
    """Chromium whose microphone plays :func:`spoken_question` once; ``flags`` are added."""
    if CHROMIUM is None or DRIVER is None:
        raise AssertionError("chromium and chromium-driver are needed (apt-get install chromium chromium-driver; .ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--use-fake-ui-for-media-stream",
                 "--use-fake-device-for-media-stream",
                 f"--use-file-for-fake-audio-capture={spoken_question(tmp_path)}%noloop",
                 "--autoplay-policy=no-user-gesture-required", f"--user-data-dir={tmp_path / 'profile'}", *flags):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    try:
        yield driver
    finally:
        driver.get("about:blank")  # the playground hangs up its call on leaving; quitting alone would not
        driver.quit()


def hands_free_turn(browser: webdriver.Chrome, wait: WebDriverWait) -> None:
    """Start hands-free: the question is heard, answered in a few words, played, and timed."""
    browser.find_element(By.ID, "handsfree").click()  # the fake microphone starts playing the recording
    wait.until(lambda d: any("spider" in e.text.lower() for e in d.find_elements(By.CSS_SELECTOR, ".turn.user")))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '.turn.assistant[data-status="completed"]'))
    wait.until(lambda d: float(d.find_element(By.TAG_NAME, "body").get_attribute("data-audio-played") or 0) > 0.5)
    answer = browser.find_element(By.CSS_SELECTOR, ".turn.assistant .text").text
    assert len(answer.split()) >= 3, answer
    latency = browser.find_element(By.ID, "latency").text
    assert latency.endswith(" ms") and 0 < int(latency.split()[0]) < 60_000, latency
    assert not browser.find_elements(By.CSS_SELECTOR, ".error")

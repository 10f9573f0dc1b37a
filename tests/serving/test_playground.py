"""The playground page in a real browser: Debian's chromium, headless, with a fake microphone
that speaks a question; the page must show what was heard, an answer, and play its audio."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.serving.browser import chromium, hands_free_turn
from tests.serving.harness import API_KEY, ServerProcess

# Set to save a picture of the page after a good run (how docs/playground.png is made).
SCREENSHOT = os.environ.get("OMNICTL_PLAYGROUND_SCREENSHOT")


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with chromium(tmp_path, "--window-size=1000,760") as driver:
        yield driver


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
        hands_free_turn(browser, wait)
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

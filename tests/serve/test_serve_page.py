"""The status page in a real browser: Debian's chromium and chromium-driver, with Selenium,
against tasks left by real runs. Checks what a person sees, and saves screenshots under the
test's tmp_path; `UPDATE_SCREENSHOTS=1` also copies the status page to docs/status-page.png."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.helpers.proc import ROOT
from tests.serve.conftest import HOSTILE_HOLDER, PAUSE_NOTE, World, serving

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    if not Path(CHROMEDRIVER).exists():
        pytest.skip("chromium-driver is not installed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,900", "--disable-javascript"):  # fmt: skip
        options.add_argument(arg)
    # The page needs no JavaScript: it is off, as for a person who turned it off.
    options.add_experimental_option(
        "prefs", {"profile.managed_default_content_settings.javascript": 2}
    )
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def _rows(driver: WebDriver) -> dict[str, str]:
    return {
        row.get_attribute("data-task") or "": row.text
        for row in driver.find_elements(By.CSS_SELECTOR, "#tasks tr.task")
    }


def test_status_page_and_task_page(world: World, browser: WebDriver, tmp_path: Path) -> None:
    with serving(world.env, tmp_path / "serve.log") as served:
        browser.get(served.base + "/")
        assert browser.title == "cron-runner"
        rows = _rows(browser)
        assert set(rows) == {"healthy", "failing", "berlin", "hostile", "lost", "stopped",
                             "alone", "nightly", "slow", "q-ok", "q-billed", "held-back"}  # fmt: skip
        assert "paused by" in rows["held-back"] and PAUSE_NOTE in rows["held-back"]
        assert "overdue" not in rows["held-back"]
        paused_strip = browser.find_elements(By.CSS_SELECTOR, "tr[data-task=held-back] .run")
        assert [s.get_attribute("class") for s in paused_strip] == ["run run-paused", "run run-ran"]
        assert "failing: unavailable" in rows["alone"]
        assert "ok" in rows["healthy"]
        assert "failing: failed" in rows["failing"]
        assert "overdue" in rows["nightly"]
        assert "running on pod-slow" in rows["slow"] and "over max runtime" in rows["slow"]
        assert "failing: lease_lost" in rows["lost"]
        # Times in UTC and in the task's zone.
        assert "UTC" in rows["berlin"] and "(Europe/Berlin)" in rows["berlin"]
        # The strip: one mark per run, missed slots among them.
        strip = browser.find_elements(By.CSS_SELECTOR, "tr[data-task=failing] .run")
        assert [s.get_attribute("class") for s in strip] == ["run run-failed"] * 2
        missed = browser.find_elements(By.CSS_SELECTOR, "tr[data-task=nightly] .run-missed")
        assert missed
        assert browser.find_elements(By.CSS_SELECTOR, "tr[data-task=lost] .run-lost")
        assert "watchdog last ran" in browser.find_element(By.ID, "watchdog").text
        queues = browser.find_element(By.ID, "queues").text
        assert "billing" in queues
        # The hostile holder is text, not markup: no element was made of it.
        assert not browser.find_elements(By.CSS_SELECTOR, "#tasks b, #tasks script, #tasks img")
        assert HOSTILE_HOLDER in rows["hostile"]
        browser.save_screenshot(str(tmp_path / "status-page.png"))
        # The README's picture: refreshed on request, so a test run leaves the tree clean.
        if os.environ.get("UPDATE_SCREENSHOTS") == "1":
            shutil.copy(tmp_path / "status-page.png", ROOT / "docs" / "status-page.png")

        browser.find_element(By.LINK_TEXT, "hostile").click()
        assert browser.find_element(By.ID, "task-name").text == "hostile"
        history = browser.find_element(By.ID, "history").text
        assert HOSTILE_HOLDER in history and "command exited with code 3" in history
        assert not browser.find_elements(By.CSS_SELECTOR, "#history b, #history script")
        browser.save_screenshot(str(tmp_path / "task-page.png"))

        browser.get(served.base + "/tasks/held-back")
        paused = browser.find_element(By.ID, "paused").text
        assert PAUSE_NOTE in paused and "until 2099-01-01 00:00:00 UTC" in paused
        assert "cron-runner resume held-back" in paused
        assert not browser.find_elements(By.CSS_SELECTOR, "#paused i, #history i")
        history = browser.find_element(By.ID, "history").text
        assert "pause" in history and f"until 2099-01-01 00:00:00 UTC: {PAUSE_NOTE}" in history
        browser.get(served.base + "/tasks/nightly")
        assert "cron-runner ack nightly" in browser.find_element(By.ID, "missed").text
        browser.get(served.base + "/tasks/no-such-task")
        assert browser.find_element(By.TAG_NAME, "h1").text == "Not found"
    assert (tmp_path / "status-page.png").stat().st_size > 10_000

"""The link `ablate ui` prints, opened in headless Chromium: what a person checks on the rendered page.

Debian's `chromium` and `chromedriver` (`.ci/run` installs both); the test skips only where they are
missing. Waits are for what the page renders, with generous hang guards.
"""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from test_ui import _read_until, _start_ui

from ablate.train.launch import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
RENDER_TIMEOUT = 180  # seconds; a hang guard: the page usually renders in a few
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="no chromium/chromedriver on PATH"),
]
# Headless Chromium's flags, the ones docs/screenshots.py takes docs/mlflow-ui.md's pictures with
CHROMIUM_FLAGS = runpy.run_path(str(Path(__file__).parents[2] / "docs" / "screenshots.py"))["FLAGS"]
GENAI_PAGES = ("Sessions", "Judges", "Prompts", "Agent versions")  # MLflow's GenAI sidebar, not training's


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="ablate-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1600,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _wait_for_texts(driver, texts: list[str]) -> str:
    """The page's text once every one of `texts` is in it."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    def body(d) -> str:
        return d.find_element("tag name", "body").text

    try:
        WebDriverWait(driver, RENDER_TIMEOUT).until(lambda d: all(t in body(d) for t in texts))
    except TimeoutException:
        missing = [t for t in texts if t not in body(driver)]
        raise AssertionError(f"not rendered: {missing}; the page shows:\n{body(driver)[:3000]}") from None
    return body(driver)


def _metric_headers(driver) -> list[str]:
    """The `val/...` column headers of the runs grid, in the grid's column order."""
    cells = driver.find_elements("css selector", "[role=columnheader][aria-colindex]")
    ordered = sorted(((int(c.get_attribute("aria-colindex")), c.text) for c in cells), key=lambda x: x[0])
    return [text for _, text in dict.fromkeys(ordered) if text.startswith("val/")]


def _wait_for(driver, condition, shown):
    """Wait until `condition(driver)` holds; what `shown(driver)` gives, either way (the assert says more)."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        WebDriverWait(driver, RENDER_TIMEOUT).until(condition)
    except TimeoutException:
        pass
    return shown(driver)


def test_the_printed_link_opens_a_comparison_of_the_variants_in_a_browser(finished_sweep, browser):
    port = free_port()
    proc = _start_ui(finished_sweep, port)
    try:
        url = _read_until(proc, r"MLflow UI: (\S+)")[0].group(1)
        runs = ["transformer-s0", "transformer-s1", "diff-s0", "diff-s1"]

        browser.get(url)
        page = _wait_for_texts(browser, [*runs, "val/loss", "val/ar_hit", "val/others"])
        # The model-training workflow: its sidebar, none of the GenAI one's pages.
        sidebar = browser.find_element("tag name", "nav").text.splitlines()
        assert "Runs" in sidebar and "Models" in sidebar, sidebar
        assert not set(GENAI_PAGES) & set(sidebar), sidebar
        # The trials grouped by variant, every seed's run listed under its group, the parent filtered out.
        assert "Group: transformer" in page and "Group: diff" in page
        # The validation columns first, Table 6's three in its order: read in the grid's column order
        # (a header's aria-colindex; the DOM order of a virtualised grid need not be it), waited for.
        first = ["val/loss", "val/ar_hit", "val/others"]
        headers = _wait_for(browser, lambda d: _metric_headers(d)[:3] == first, _metric_headers)
        assert headers[:3] == first, headers

        browser.get(url + "&compareRunsMode=CHART")
        charts = _wait_for_texts(browser, ["transformer (val/loss)", "diff (val/loss)"])
        # The validation section comes first, its first chart val/loss; one line per variant.
        sections = [line for line in charts.splitlines() if line in ("val", "train", "rms", "lambda")]
        assert sections and sections[0] == "val", sections
        assert charts.index("val/loss") < charts.index("val/ar_hit") < charts.index("val/others")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except Exception:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

"""The link `ablate ui` prints, opened in headless Chromium: what a person checks on the rendered page.

Debian's `chromium` and `chromedriver` (`.ci/run` installs both); the test skips only where they are
missing. Waits are for what the page renders, with generous hang guards.
"""

from __future__ import annotations

import runpy
import shutil
import tempfile
from pathlib import Path

import pytest
from test_ui import _read_until, _start_ui, _stop

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

        browser.get(url.replace("&compareRunsMode=CHART", ""))  # the runs list beside the charts
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

        browser.get(url)  # the printed link: the chart view
        differences, against_tokens = "paired differences vs the reference row", "val against training tokens"
        charts = _wait_for_texts(browser, [differences, against_tokens, "sweep mini"])
        # The differences first, then the validation metrics against tokens (charts below the fold are
        # drawn when scrolled to).
        assert charts.index(differences) < charts.index(against_tokens)
        assert "tokens/val/ar_hit_share" not in charts  # the same in every run: left out
    finally:
        _stop(proc)


def _plotted(driver) -> list[list[dict]]:
    """Each chart's plotly traces (name, x, y) as drawn, in the page's order."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('.js-plotly-plot')).map("
        "e => (e.data || []).map(t => ({name: t.name, x: t.x, y: t.y})))"
    )


def _series(traces: list[dict]) -> list[dict]:
    """The distinct series of a chart (MLflow draws each line twice: smoothed and as logged)."""
    seen = {}
    for t in traces:
        seen.setdefault((t["name"], tuple(t["x"] or ()), tuple(t["y"] or ())), t)
    return list(seen.values())


def test_the_printed_link_charts_each_rows_paired_difference_against_tokens(finished_sweep, browser):
    import csv

    port = free_port()
    proc = _start_ui(finished_sweep, port)
    try:
        url = _read_until(proc, r"MLflow UI: (\S+)")[0].group(1)
        browser.get(url)
        keys = [f"diff/val/loss/diff/{end}" for end in ("mean", "low", "high")]
        _wait_for_texts(browser, [" vs ".join(keys), "sweep mini"])
        first = _wait_for(browser, lambda d: len(_series((_plotted(d) or [[]])[0])) >= 3, _plotted)[0]
        series = _series(first)
        # One row besides the reference: three series of the parent run, mean inside its interval.
        assert [s["name"] for s in series] == ["sweep mini"] * 3, series
        mean, low, high = series
        # Against tokens: the runs validated every 4 steps of 256 tokens (MLflow's step is the tokens).
        assert mean["x"] == low["x"] == high["x"] == [1024, 2048], series
        assert all(lo < m < hi for lo, m, hi in zip(low["y"], mean["y"], high["y"]))
        # The last point is the report's paired difference (its summary.csv, the table's Δ unrounded).
        with open(finished_sweep.parent / "reports" / "mini" / "summary.csv") as f:
            row = next(r for r in csv.DictReader(f) if r["variant"] == "diff")
        reported = [float(row[k]) for k in ("diff_vs_first", "diff_lo", "diff_hi")]
        assert [mean["y"][-1], low["y"][-1], high["y"][-1]] == pytest.approx(reported, rel=1e-12)
    finally:
        _stop(proc)

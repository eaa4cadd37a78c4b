"""Take the two MLflow UI pictures of docs/mlflow-ui.md (the README shows the first): the list view, and the
printed link's chart view (the paired differences first).

    ablate sweep recipes/table6.yaml --scale tiny --yes --reports ablate-runs/reports   # the quickstart
    ablate ui &                                                                         # prints the link
    python docs/screenshots.py 'http://127.0.0.1:5000/#/experiments/1/runs?...' --out docs/

Headless Chromium through chromedriver (Debian's `chromium` and `chromium-driver`, selenium from the dev
extras), the window the pictures use, a fresh browser profile: the pictures show what a new user
sees, MLflow's Assistant panel included (it opens on a browser's first visit; its x closes it for good).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
WINDOW = "--window-size=1500,900"
SETTLE_S = 5  # after the runs' names render, for the charts to draw


def take(url: str, out: Path, timeout: float = 180.0) -> list[Path]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    profile = tempfile.mkdtemp(prefix="ablate-chromium-")
    for flag in (*FLAGS, WINDOW, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(
        service=Service(shutil.which("chromedriver") or "chromedriver"), options=options
    )
    written = []
    try:
        charts = url if "compareRunsMode=CHART" in url else url + "&compareRunsMode=CHART"
        for name, link, ready in (
            ("mlflow-ui-list.png", charts.replace("&compareRunsMode=CHART", ""), "val/loss"),
            ("mlflow-ui-charts.png", charts, "paired differences vs the reference row"),
        ):
            driver.get(link)
            WebDriverWait(driver, timeout).until(
                lambda d, ready=ready: ready in d.find_element("tag name", "body").text
            )
            time.sleep(SETTLE_S)
            for button in driver.find_elements(
                "css selector", "[aria-label*='Close'][aria-label*='ssistant']"
            ):
                button.click()
            out.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(out / name))
            written.append(out / name)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the link `ablate ui` printed")
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    for path in take(args.url, args.out):
        print(path)

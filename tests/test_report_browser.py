"""`snakemake --report` of the test run, opened in a real headless browser (Debian's chromium
through chromedriver, driven by selenium): every figure decodes as an image, every result
table is an HTML table, and a figure opened from the menu is drawn on the page. The screenshot
of that view is kept in docs/report.png (REASONRL_UPDATE_DOCS=1 rewrites it)."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT = REPO / "docs" / "report.png"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# Everything a headless start would otherwise fetch, refused by a machine without internet.
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1400,1000",
]  # fmt: skip
FIGURES = {"pass_at_1.png", "pass_at_k.png", "sft_loss.png", "best_of_n.png", "rounds.png"}
TABLES = {"summary.html", "preference.html", "best_of_n.html", "hgs.html"}
# The figures of every image result: the natural width each data URI decodes to (0: broken).
DECODE_IMAGES = """
const done = arguments[arguments.length - 1];
const images = Object.entries(results).filter(([, r]) => r.mime_type.startsWith("image/"));
Promise.all(images.map(([path, r]) => new Promise((resolve) => {
    const img = new Image();
    img.onload = () => resolve([path, img.naturalWidth]);
    img.onerror = () => resolve([path, 0]);
    img.src = r.data_uri;
}))).then(done);
"""

pytestmark = [
    pytest.mark.workflow,
    pytest.mark.skipif(
        not (CHROMIUM and CHROMEDRIVER),
        reason="chromium and chromium-driver not installed (make test-deps installs them)",
    ),
]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def report_page(snakemake, test_run, browser):
    snakemake("--configfile", "config/test.yaml", "--report", "browser-report.html", cwd=test_run)
    browser.get((test_run / "browser-report.html").as_uri())
    return browser


def _by_name(results: dict) -> dict[str, dict]:
    return {Path(path).name: entry for path, entry in results.items()}


def test_every_figure_of_the_report_decodes_in_the_browser(report_page):
    widths = {
        Path(path).name: width for path, width in report_page.execute_async_script(DECODE_IMAGES)
    }
    assert set(widths) >= FIGURES, sorted(widths)
    assert all(width > 100 for width in widths.values()), widths


def test_every_result_table_is_an_html_table(report_page):
    results = _by_name(report_page.execute_script("return results;"))
    pages = {name: entry for name, entry in results.items() if entry["mime_type"] == "text/html"}
    assert set(pages) >= TABLES, sorted(results)
    for name, entry in pages.items():
        html = base64.b64decode(entry["data_uri"].split("base64,", 1)[1]).decode()
        assert "<table" in html and "<td>" in html, name


def test_a_figure_opened_from_the_menu_is_drawn(report_page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.wait import WebDriverWait

    wait = WebDriverWait(report_page, 30)
    category = (By.XPATH, "//span[normalize-space()='Curves']")
    wait.until(shown.element_to_be_clickable(category)).click()
    # the eye button in the result's row shows it
    view = "//td[normalize-space()='results/report/pages/rounds.png']/..//a[@iconname='eye']"
    wait.until(shown.element_to_be_clickable((By.XPATH, view))).click()
    figure = wait.until(
        lambda page: next(
            (img for img in page.find_elements(By.TAG_NAME, "img")
             if img.get_attribute("src").startswith("data:image/png") and img.is_displayed()),
            None,
        )
    )  # fmt: skip
    assert report_page.execute_script("return arguments[0].naturalWidth;", figure) > 100
    screenshot = report_page.get_screenshot_as_png()
    if os.environ.get("REASONRL_UPDATE_DOCS") == "1":
        SCREENSHOT.write_bytes(screenshot)
    assert SCREENSHOT.exists(), "docs/report.png: REASONRL_UPDATE_DOCS=1 writes it"

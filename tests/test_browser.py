"""The built documentation and a `kbert report` page, opened in a real browser: headless Chromium from the system's
packages (Debian's chromium and chromium-driver, which .ci/run installs), driven by Selenium. Every page loads, every
image loads, the console holds no error; screenshots of the home page and a report page go to build/screenshots/."""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbert.cli import main
from tests.tiny import run_tiny

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO / "build" / "screenshots"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra")
if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip("apt install chromium chromium-driver (.ci/run does)", allow_module_level=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder holding the built docs (docs/) and a tiny Titanic run's report (report/)."""
    root = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", "-D", "nb_execution_mode=off",
                            str(REPO / "docs"), str(root / "docs")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    run_tiny("titanic", root / "work", "tiny", limit_rows=120, folds=3, epochs=2)
    assert main(["report", str(root / "work" / "runs" / "titanic" / "tiny"), "--output", str(root / "report")]) == 0
    return root


@pytest.fixture(scope="module")
def served(site) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator:
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def open_page(browser, url: str) -> dict:
    """Load ``url``; what a reader would notice: the HTTP status of the page, images that did not load, and the
    console's errors (a missing asset, a script error)."""
    browser.get_log("browser")  # drop what an earlier page left
    browser.get(url)
    broken = browser.execute_script(
        "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src);")
    errors = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    return {"title": browser.title, "images": browser.execute_script("return document.images.length;"),
            "broken": broken, "errors": errors}


def test_every_docs_page_and_a_report_page_load_in_chromium_with_their_images_and_no_console_errors(
        site, served, browser):
    pages = sorted(p.relative_to(site).as_posix() for p in (site / "docs").glob("*.html"))
    assert "docs/index.html" in pages and len(pages) >= 20
    for page in pages + ["report/index.html"]:
        seen = open_page(browser, f"{served}/{page}")
        assert seen["title"] and "404" not in seen["title"], page
        assert seen["broken"] == [], (page, seen["broken"])
        assert seen["errors"] == [], (page, seen["errors"])
    report = open_page(browser, f"{served}/report/index.html")
    assert report["images"] >= 2  # the run's plots, as images that loaded

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for page, name in (("docs/index.html", "docs-home.png"), ("report/index.html", "report.png")):
        browser.get(f"{served}/{page}")
        assert browser.save_screenshot(str(SCREENSHOTS / name))
        assert (SCREENSHOTS / name).read_bytes().startswith(b"\x89PNG")

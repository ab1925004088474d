"""The dashboard and the report as a user sees them: opened in headless Chromium (Debian's), driven by
Playwright, on a real study."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import load_study, rerun_while_noisy
from playwright.sync_api import sync_playwright
from test_dashboard import free_port

from autotune.results.selection import clean_trials, is_valid

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory, end_to_end) -> Path:
    """A real study: three trials of a tiny model, best.json and its report."""
    assert CHROMIUM, "Debian's chromium is missing: run 'make setup' (as root) or 'apt-get install chromium'"
    searcher = end_to_end(tmp_path_factory.mktemp("browser"))
    space = searcher.space(batch_size=[2, 4, 8])
    result = rerun_while_noisy(lambda: searcher.search("--no-speed-pruning", study="b", space=space, trials=4))
    assert result.returncode == 0, result.stderr
    report = searcher("report", "--study", "b")
    assert report.returncode == 0, report.stderr
    return searcher.workdir


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def test_the_dashboard_shows_the_trials_and_their_logs(study_dir, browser):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", "dashboard", "--study", "b", "--port", str(port)],
        cwd=study_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        studies, deadline = None, time.monotonic() + 60
        while studies is None and time.monotonic() < deadline:
            try:
                studies = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2).read())[
                    "study_summaries"
                ]
            except OSError:
                time.sleep(0.5)
        study_id = next(s["study_id"] for s in studies if s["study_name"] == "b")
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"http://127.0.0.1:{port}/dashboard/studies/{study_id}/trials")
        page.get_by_text("Trial 3", exact=False).first.wait_for(timeout=30_000)  # every trial is listed
        for number in range(4):
            assert page.get_by_text(f"Trial {number}", exact=False).count() >= 1
        page.get_by_text("trial.log").first.wait_for(timeout=30_000)  # the selected trial's artifact
        page.goto(f"http://127.0.0.1:{port}/dashboard/studies/{study_id}")
        page.get_by_text("best.json").first.wait_for(timeout=30_000)  # the study's artifact
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_report_opens_with_no_network_and_shows_its_charts(study_dir, browser):
    report = study_dir / "studies" / "b" / "report.html"
    page = browser.new_page()
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(report.as_uri())
    assert page.title() == "autotune report: b"
    # Pareto front, importances, speedup, drift against speed, best so far against time
    assert page.locator("figure svg").count() == 5
    assert all(page.locator("figure svg").nth(i).is_visible() for i in range(5))
    assert page.get_by_text("winner: trial", exact=False).count() == 1  # the winner comes first
    rows = page.locator("table").first.locator("tr")
    assert rows.count() == 1 + len(clean_trials(load_study(study_dir, "b")))  # header and every clean trial
    baseline_clean = is_valid(load_study(study_dir, "b").trials[0])  # a noisy baseline is no row of its own
    assert ("1.00x" in page.locator("table").first.inner_text()) == baseline_clean
    assert requests == [report.as_uri()]  # nothing fetched beyond the file itself

"""Screenshots of a real study for the README: optuna-dashboard (history and a trial with its log) and
the report, taken with headless Chromium through Playwright.

    .venv/bin/python docs/screenshots.py --study resnet50-ipex
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

OUT = Path(__file__).resolve().parent / "manual" / "img"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--studies-dir", default="studies")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "autotune.cli", "report", "--study", args.study, "--studies-dir", args.studies_dir],
        check=True,
    )
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "dashboard",
            "--study",
            args.study,
            "--studies-dir",
            args.studies_dir,
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, studies = time.monotonic() + 60, None
        while studies is None and time.monotonic() < deadline:
            try:
                studies = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2).read())[
                    "study_summaries"
                ]
            except OSError:
                time.sleep(0.5)
        study_id = next(s["study_id"] for s in studies if s["study_name"] == args.study)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 950})
            page.goto(f"http://127.0.0.1:{port}/dashboard/studies/{study_id}")
            page.wait_for_timeout(4000)
            page.screenshot(path=str(OUT / "dashboard-study.png"))
            page.goto(f"http://127.0.0.1:{port}/dashboard/studies/{study_id}/trials")
            page.get_by_text("trial.log").first.wait_for(timeout=30_000)
            page.get_by_text("trial.log").first.scroll_into_view_if_needed()
            page.wait_for_timeout(1500)
            page.screenshot(path=str(OUT / "dashboard-trial.png"))
            page.goto((Path(args.studies_dir) / args.study / "report.html").resolve().as_uri())
            page.set_viewport_size({"width": 1200, "height": 1400})
            page.screenshot(path=str(OUT / "report.png"))
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"wrote {', '.join(str(p) for p in sorted(OUT.glob('*.png')))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

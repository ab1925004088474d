"""`autotune dashboard` serves the study's storage with optuna-dashboard, on loopback only."""

import json
import socket
import subprocess
import sys
import time
import urllib.request

from conftest import rerun_while_noisy, write_space


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_dashboard_serves_the_study_on_loopback(searcher, workdir):
    space = write_space(workdir / "space.yaml")
    searched = rerun_while_noisy(  # its best.json is the study artifact the dashboard serves
        lambda: searcher.search(study="d", space=space, trials=1)
    )
    assert searched.returncode == 0, searched.stderr
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", "dashboard", "--study", "d", "--port", str(port)],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        body, deadline = None, time.monotonic() + 60
        while body is None and time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2).read().decode()
            except OSError:
                time.sleep(0.5)
        assert body is not None and '"d"' in body
        study_id = next(s["study_id"] for s in json.loads(body)["study_summaries"] if s["study_name"] == "d")
        detail = json.loads(
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{study_id}", timeout=10).read()
        )
        assert [a["filename"] for a in detail["artifacts"]] == ["best.json"]  # the study's artifact
        log = detail["trials"][0]["artifacts"][0]
        assert log["filename"] == "trial.log" and log["mimetype"] == "text/plain"
        served = (
            urllib.request.urlopen(
                f"http://127.0.0.1:{port}/artifacts/{study_id}/{detail['trials'][0]['trial_id']}/{log['artifact_id']}",
                timeout=10,
            )
            .read()
            .decode()
        )
        assert "instance 0: env" in served and "==== stderr-0.log ====" in served
        listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout
        local_addresses = [line.split()[3] for line in listening.splitlines()]
        assert local_addresses == [f"127.0.0.1:{port}"]
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert f"http://127.0.0.1:{port}/" in out

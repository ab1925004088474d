"""Files written by earlier versions keep working: a best.json exported before the package was split
into layers (schema autotune.best/2, `python -m autotune.worker --best ...` in its launch commands)
replays with today's worker, by the very command it records."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from conftest import TESTS

from autotune.results.best_json import read_best


def test_a_best_json_from_before_the_layers_replays_by_its_own_command(tmp_path):
    from tiny_models import tiny_cnn

    text = (TESTS / "data" / "best-before-layers.json").read_text()
    text = text.replace("{PYTHON}", sys.executable).replace("{TESTS}", str(TESTS)).replace("{WORK}", str(tmp_path))
    best_path = tmp_path / "studies" / "old" / "best.json"
    best_path.parent.mkdir(parents=True)
    best_path.write_text(text)
    weights = tmp_path / "studies" / "old" / "reference" / "weights.pt"
    weights.parent.mkdir()
    torch.save(tiny_cnn().state_dict(), weights)

    best = read_best(best_path)  # today's reader takes it: a timed winner with a job
    assert best.schema == "autotune.best/2" and best.config.batch_size == 2
    assert best.launch is not None
    command = best.launch.commands[0]
    assert "-m autotune.worker --best" in command
    replay = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0, replay.stderr[-2000:]
    result = json.loads(replay.stdout)
    assert result["instance"] == 0 and result["iterations"] >= 5 and result["samples_per_call"] == 2
    assert result["threads"]["torch"] == 2 and result["allocator"]["verified"] is True
    assert result["latency_ms"]["p50"] > 0 and result["drift"] is None  # a replay measures, it does not judge drift

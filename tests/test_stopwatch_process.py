"""The stopwatch both plain-process timings use (compare --independent, verify --through-load): its one
barrier lets the instances start together, stops when a sibling failed, and gives up after its timeout."""

from __future__ import annotations

import pytest

from autotune.stopwatch_process import USAGE, count_calls, main, wait_for_siblings, warm_up


def test_the_barrier_opens_once_every_instance_is_ready(tmp_path):
    (tmp_path / "ready-1").touch()
    wait_for_siblings(tmp_path, 0, 2, timeout_s=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready-0", "ready-1"]


def test_the_barrier_stops_when_a_sibling_failed_and_times_out_otherwise(tmp_path):
    (tmp_path / "failed-1").touch()
    with pytest.raises(RuntimeError, match="failed-1"):
        wait_for_siblings(tmp_path, 0, 2, timeout_s=5)
    (tmp_path / "failed-1").unlink()
    with pytest.raises(TimeoutError, match="not ready within 0s"):
        wait_for_siblings(tmp_path, 0, 2, timeout_s=0.05)


def test_the_loops_count_calls_in_their_window():
    calls: list[int] = []
    done, warmed_s = warm_up(lambda: calls.append(1), 3, 0.0)
    assert done == 3 and len(calls) == 3 and warmed_s >= 0
    counted, start, end = count_calls(lambda: calls.append(1), 0.02)
    assert counted == len(calls) - 3 and end - start >= 0.02


def test_a_wrong_command_line_prints_the_usage(capsys):
    assert main(["load", "1"]) == 2
    assert capsys.readouterr().err.strip() == USAGE

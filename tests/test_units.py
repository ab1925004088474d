"""Pure pieces: durations, statistics, drift arithmetic, CPU lists."""

import numpy as np
import pytest

from autotune.common.durations import parse_duration
from autotune.common.errors import UserError
from autotune.common.sizes import parse_size_mib
from autotune.machine.probe import format_cpu_ranges, parse_cpu_list
from autotune.measure.drift import compute_drift, relative_l2, top1_agreement
from autotune.measure.stopwatch import common_window_throughput, latency_summary, samples_needed
from autotune.model.inputs import fixed_batches


@pytest.mark.parametrize(
    "text,seconds", [("90s", 90), ("20m", 1200), ("2h", 7200), ("1h30m", 5400), ("45", 45), (" 3M ", 180)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "5x", "-3m", "0s", "m5"])
def test_parse_duration_rejects(text):
    with pytest.raises(UserError):
        parse_duration(text)


def test_cpu_list():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]


def test_percentiles_need_enough_samples():
    assert samples_needed(50) == 2 and samples_needed(90) == 10 and samples_needed(99) == 100
    short = latency_summary(np.full(20, 0.01))
    assert short.p50 == pytest.approx(10.0) and short.p90 == pytest.approx(10.0)
    assert short.p99 is None and short.samples == 20
    long = latency_summary(np.linspace(0.001, 0.1, 200))
    assert long.p99 is not None and long.p99 > long.p90 > long.p50


def _stamps(start: float, period: float, n: int) -> np.ndarray:
    begins = start + period * np.arange(n)
    return np.stack([begins, begins + period], axis=1)


def test_common_window_counts_only_overlap():
    # instance A runs 0..10s at 1 it/s; B starts late (5s) and runs to 15s at 2 it/s.
    a, b = _stamps(0.0, 1.0, 10), _stamps(5.0, 0.5, 20)
    result = common_window_throughput([a, b], batch_size=4)
    assert result.window_s == pytest.approx(5.0)
    # in (5, 10]: A finishes 5 iterations, B finishes 10.
    assert result.throughput_sps == pytest.approx(4 * 15 / 5.0)


def test_common_window_without_overlap_is_invalid():
    result = common_window_throughput([_stamps(0, 1, 3), _stamps(10, 1, 3)], batch_size=1)
    assert result.valid is False and result.throughput_sps == 0


def test_drift_metrics():
    ref = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert relative_l2(ref, ref) == 0.0
    assert relative_l2(ref * 1.1, ref) == pytest.approx(0.1)
    assert top1_agreement(np.array([[1.0, 0.0], [1.0, 0.0]]), ref) == 0.5
    bad = compute_drift(np.array([[np.nan, 0.0], [0.0, 1.0]]), ref)
    assert bad.relative_l2 == float("inf") and bad.top1_agreement == 0.0


def test_fixed_batches_keep_every_batch_full_even_with_few_inputs():
    import torch

    inputs = (
        torch.arange(3).float().reshape(3, 1),
        torch.arange(3).reshape(3, 1) * 10,
    )  # two model inputs, kept aligned
    batches = fixed_batches(inputs, 8)
    assert len(batches) == 1 and batches[0][0].shape == (8, 1) and batches[0][1].dtype == torch.int64
    assert batches[0][0][:3, 0].tolist() == [0, 1, 2] and set(batches[0][0][:, 0].tolist()) == {0, 1, 2}
    assert (batches[0][1] == batches[0][0].long() * 10).all()
    assert [b[0].shape[0] for b in fixed_batches((torch.zeros(10, 1),), 4)] == [4, 4, 4]


def test_input_specs_parse_and_draw_in_range():
    from autotune.model.inputs import parse_inputs, synthetic

    (image,) = parse_inputs("3x8x8")
    assert image.name == "input" and image.shape == (3, 8, 8) and image.dtype == "float32"
    ids, mask = parse_inputs("input_ids:int64:16:5-9,attention_mask:int64:16:1-2")
    batch = synthetic((ids, mask), 4, seed=0)
    assert batch[0].shape == (4, 16) and int(batch[0].min()) >= 5 and int(batch[0].max()) <= 8 and (batch[1] == 1).all()
    for bad in ("ids:int64:16:9-5", "ids:float16:16", "ids:int64", "a:int64:4,a:int64:4"):
        with pytest.raises(UserError):
            parse_inputs(bad)


def test_sizes_parse_units_and_shares():
    assert (
        parse_size_mib("8G", "--x") == 8192
        and parse_size_mib("800M", "--x") == 800
        and parse_size_mib("1.5gib", "--x") == 1536
    )
    assert parse_size_mib("50%", "--x", share_of_mib=1000) == 500
    for bad in ("lots", "10", "-1G", "50%"):
        with pytest.raises(UserError, match="--x"):
            parse_size_mib(bad, "--x")


def test_cpu_ranges_are_compact_for_people():
    assert format_cpu_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and format_cpu_ranges(()) == "-"
    assert parse_cpu_list(format_cpu_ranges([3, 0, 1, 9])) == [0, 1, 3, 9]


def test_cache_eviction_removes_least_recently_used_first_and_never_the_one_in_use(tmp_path):
    import os
    import time

    from autotune.runner.artifact_cache import META_FILE, evict_least_recently_used, mark_used

    dirs = []
    for i, name in enumerate(("old", "middle", "new")):
        d = tmp_path / "artifacts" / name
        d.mkdir(parents=True)
        (d / "model.bin").write_bytes(b"x" * 600_000)
        (d / META_FILE).write_text("{}")
        mark_used(d)
        os.utime(d / "last-used", (time.time() - 100 + i, time.time() - 100 + i))
        dirs.append(d)
    (tmp_path / "artifacts" / "half-built.building").mkdir()  # not complete: not counted, not touched
    mark_used(dirs[0])  # "old" used just now: now the most recent
    assert evict_least_recently_used(tmp_path, cap_mib=1.2, keep=dirs[1]) == ["new"]
    assert evict_least_recently_used(tmp_path, cap_mib=0.1, keep=dirs[1]) == ["old"]  # "middle" is in use: kept
    assert sorted(p.name for p in (tmp_path / "artifacts").iterdir() if p.is_dir()) == ["half-built.building", "middle"]


def test_two_artifacts_whose_names_differ_after_a_dot_are_built_under_two_locks(tmp_path):
    """An int4 IR's name holds its ratio (1.0): builders of two such artifacts must not share a lock, nor
    one held while building block the eviction of the other."""
    import fcntl

    from autotune.runner.artifact_cache import build_lock, lock_file

    first = tmp_path / "artifacts" / "openvino-generate-int4_sym-32-1.0-aaaa"
    second = tmp_path / "artifacts" / "openvino-generate-int4_sym-32-1.0-bbbb"
    assert lock_file(first) != lock_file(second)
    with build_lock(first), open(lock_file(second), "w") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: raises BlockingIOError when shared
        fcntl.flock(other, fcntl.LOCK_UN)


def test_an_isa_flag_probed_since_an_earlier_study_is_not_a_different_machine():
    """A study recorded before a flag (avx_vnni) was probed is still this machine's, for priors and fleets
    alike; a flag it recorded differently is a different machine."""
    import optuna

    from autotune.machine.fingerprint import fingerprint_differences
    from autotune.tuning.priors import same_machine_studies

    earlier = {"cpu_model": "AMD EPYC", "physical_cores": 2, "isa": {"avx2": True, "avx512_vnni": False}}
    here = {**earlier, "isa": {**earlier["isa"], "avx_vnni": False}}
    other = {**earlier, "isa": {"avx2": True, "avx512_vnni": True}}
    assert fingerprint_differences({"hardware": earlier}, {"hardware": here}) == []
    assert fingerprint_differences({"hardware": other}, {"hardware": here}) == [
        "hardware: isa.avx512_vnni True -> False"
    ]
    storage = optuna.storages.InMemoryStorage()
    for name, hardware in (("before", earlier), ("elsewhere", other)):
        study = optuna.create_study(storage=storage, study_name=name)
        study.set_user_attr("fingerprint", {"hardware": hardware})
        study.set_user_attr("spec", {"task": "classify"})
    assert [name for _, name in same_machine_studies([storage], "new", here, "classify")] == ["before"]

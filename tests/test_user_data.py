"""Your model, your data: a real classifier trained here, its accuracy kept by int8, destroyed by bad calibration.

The digits classifier is trained in the test on scikit-learn's bundled digits; autotune evaluates and
calibrates on the held-out part, never seen in training.
"""

import json

import pytest
import torch
from conftest import assert_trials_ran, load_study, tiny
from digits import garbage_calibration, train_digits

INT8 = {
    "eager": {"precision": ["fp32"], "memory_format": ["contiguous"]},
    "openvino": {"precision": ["int8"], "hint": ["LATENCY"], "streams": [1], "int8_float": ["f32"]},
    "onnxruntime": {
        "precision": ["int8"],
        "execution_mode": ["sequential"],
        "graph_optimization": ["all"],
        "inter_op_threads": [1],
    },
    "torchao": {"precision": ["int8"], "scheme": ["static"], "memory_format": ["contiguous"]},
}


@pytest.fixture(scope="module")
def digits(tmp_path_factory, end_to_end):
    workdir = tmp_path_factory.mktemp("digits")
    trained = train_digits(workdir)
    assert trained["accuracy"] > 0.9  # a real classifier, so that keeping its accuracy means something
    return {**trained, "workdir": workdir, "searcher": end_to_end(workdir)}


def digits_search(digits, study, *extra, backends=INT8):
    """Int8 backends against fp32 eager on the trained classifier, accuracy bounded on its held-out digits."""
    searcher = digits["searcher"]
    space = searcher.space(f"{study}.yaml", batch_size=[8], backends=backends, baseline={"batch_size": 8})
    result = searcher.search(
        *("--weights", str(digits["weights"]), "--data", str(digits["data"])),
        *("--eval-samples", "300", "--calibration-samples", "200", "--drift-metric", "accuracy", "--max-drift", "2%"),
        "--no-speed-pruning",
        *extra,
        model=tiny("digits_net"),
        input_shape="1x8x8",
        space=space,
        study=study,
        trials=len(backends),
        budget="10m",
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    return result, searcher.study(study)


def test_int8_keeps_a_trained_classifiers_accuracy(digits):
    result, study = digits_search(digits, "kept")
    assert "data: tensor file" in result.stdout and "warning" not in result.stdout
    int8 = [t for t in study.trials if t.user_attrs["config"]["precision"] == "int8"]
    assert len(int8) == 3 and all(t.state.name == "COMPLETE" for t in int8), [
        t.user_attrs.get("prune_reason") for t in int8
    ]
    for trial in int8:
        drift = trial.user_attrs["drift"]
        assert drift["samples"] == 300 and drift["reference_accuracy"] > 0.9
        assert drift["reference_accuracy"] - drift["accuracy"] <= 0.02 * drift["reference_accuracy"]
        assert drift["relative_l2"] > 0  # quantized for real: outputs moved, accuracy kept
        assert trial.user_attrs["artifact"]["details"]  # built from the user's calibration split
    best = json.loads((digits["workdir"] / "studies" / "kept" / "best.json").read_text())
    drift = best["drift"]
    assert drift["metric"] == "accuracy" and drift["relative"] is True and drift["max_drift"] == 0.02
    assert drift["evaluation"]["samples"] == 300 and drift["evaluation"]["labels"] is True
    assert "tensor file" in drift["data"] and drift["calibration"]["samples"] == 200
    assert drift["calibration"]["after_eval"] == 300  # calibration is the split after the evaluation samples


def test_int8_calibrated_on_garbage_is_pruned(digits):
    garbage = garbage_calibration(digits["workdir"])
    # two of the three static int8 engines: torchao's compile (about 20 s) would show nothing more here
    exporters = {name: INT8[name] for name in ("eager", "openvino", "onnxruntime")}
    _, study = digits_search(digits, "garbage", "--calibration-data", str(garbage), backends=exporters)
    int8 = [t for t in study.trials if t.user_attrs["config"]["precision"] == "int8"]
    assert len(int8) == 2
    for trial in int8:
        assert trial.state.name == "PRUNED", (trial.user_attrs["config"]["backend"], trial.user_attrs.get("drift"))
        assert trial.user_attrs["prune_reason"].startswith("drift: accuracy drop")
        assert trial.user_attrs["drift"]["accuracy"] < 0.5  # really destroyed, not a borderline call
        assert "throughput_sps" not in trial.user_attrs  # pruned before timing
        budget = trial.user_attrs["budget"]  # where its time went, though it was never timed
        assert sum(v for k, v in budget.items() if k != "total_s") == pytest.approx(budget["total_s"], rel=1e-6)
    # A quantized artifact is prepared in its own process before the drift check: that time is
    # preparing, not starting (`show` and the deferral of slow backends read it).
    assert any(t.user_attrs["budget"]["preparing_s"] > 0.5 for t in int8)
    assert study.trials[0].state.name == "COMPLETE"  # fp32 eager is untouched by calibration


def test_drift_is_measured_once_per_numerics_and_reused(searcher, workdir):
    space = searcher.space(
        batch_size=[2, 4], backends={"eager": {"precision": ["fp32", "bf16"], "memory_format": ["contiguous"]}}
    )

    def search(trials: int):
        return searcher.search("--no-cover-backends", "--max-drift", "1e-6", space=space, trials=trials)

    assert_trials_ran(search(1))  # the fp32 baseline, batch 2
    study = searcher.study()
    base = study.trials[0].params
    study.enqueue_trial({**base, "batch_size": 4})  # same numerics, another batch
    study.enqueue_trial({**base, "eager.precision": "bf16"})  # bf16: drift measured, beyond 1e-6
    study.enqueue_trial({**base, "eager.precision": "bf16", "batch_size": 4})  # same bf16 numerics: known to be beyond
    assert_trials_ran(search(3))
    trials = searcher.study().trials
    assert trials[1].state.name == "COMPLETE" and trials[1].user_attrs["drift"]["reused_from"] == 0
    assert trials[1].user_attrs["drift"]["relative_l2"] == trials[0].user_attrs["drift"]["relative_l2"]
    assert trials[2].state.name == "PRUNED" and trials[2].user_attrs["drift"]["reused_from"] is None  # measured here
    assert trials[3].state.name == "PRUNED" and trials[3].user_attrs["drift"]["reused_from"] == 2
    assert "not launched" in trials[3].user_attrs["prune_reason"]
    assert not (workdir / "studies" / "s" / "trials" / "00003").exists()


def test_a_drift_is_reused_only_against_the_reference_it_was_measured_on():
    """A study resumed by an autotune whose reference is computed otherwise (a new format of a language
    model's drift outputs) measures its numerics again; the same reference, on any host, reuses."""
    import optuna

    from autotune.measure.drift import Drift
    from autotune.tuning.study import same_numerics_drift

    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    trial.set_user_attr("numerics_key", "eager/bf16")
    trial.set_user_attr("drift_reference", "old")
    trial.set_user_attr(
        "drift", Drift(relative_l2=0.01, cosine_similarity=1.0, top1_agreement=1.0, samples=8).to_json()
    )
    study.tell(trial, 1.0)
    assert same_numerics_drift(study, "eager/bf16", "new") is None
    reused = same_numerics_drift(study, "eager/bf16", "old")
    assert reused is not None and reused.reused_from == 0 and reused.relative_l2 == 0.01
    assert same_numerics_drift(study, "eager/fp32", "old") is None


def test_a_language_models_drift_is_reused_at_the_same_sequences_only():
    """Generation drift is measured at the timed sequences: inductor da8w8 on a Xeon with AMX computed
    garbage decode steps at 1 sequence (relative L2 about 6,000) and drifted 0.045 at 8. Its drift at one
    count of sequences is not another's, neither to reuse nor to call the family hopeless."""
    import optuna

    from autotune.measure.drift import Drift, DriftCriterion
    from autotune.tuning.hopeless import Proposal, hopeless_family
    from autotune.tuning.study import same_numerics_drift

    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    config = {"backend": "inductor", "precision": "da8w8", "batch_size": 1, "instances": 1, "threads_per_instance": 2}
    attrs = {"numerics_key": "inductor/da8w8", "fallback_key": "inductor/da8w8", "drift_reference": "ref"}
    for key, value in {**attrs, "config": config, "budget": {"total_s": 100.0}}.items():
        trial.set_user_attr(key, value)
    drift = Drift(relative_l2=6389.0, cosine_similarity=0.0, top1_agreement=0.0, samples=764)
    trial.set_user_attr("drift", drift.to_json())
    trial.set_user_attr("prune_reason", "drift: relative_l2 drop 6389 > max 0.05")
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    assert same_numerics_drift(study, "inductor/da8w8", "ref", sequences=1) is not None
    assert same_numerics_drift(study, "inductor/da8w8", "ref", sequences=8) is None
    assert same_numerics_drift(study, "inductor/da8w8", "ref") is not None  # a classifier: any batch
    criterion = DriftCriterion()
    at = {n: Proposal("inductor", "da8w8", "inductor/da8w8", "ref", sequences=n) for n in (1, 8)}
    assert hopeless_family(study, at[1], criterion, "throughput", 99) is not None
    assert hopeless_family(study, at[8], criterion, "throughput", 99) is None


def test_image_folder_with_class_subfolders_gives_labels(searcher, workdir):
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for label in ("cat", "dog"):
        (workdir / "images" / label).mkdir(parents=True)
        for i in range(6):
            pixels = (torch.rand((20, 24, 3), generator=generator) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(workdir / "images" / label / f"{i}.png")
    result = searcher.search(
        "--data", str(workdir / "images"), "--calibration-samples", "4", study="img", trials=1, budget="2m"
    )
    assert_trials_ran(result)
    assert "image folder" in result.stdout and "12 samples, with labels" in result.stdout
    drift = load_study(workdir, "img").trials[0].user_attrs["drift"]
    assert (
        drift["samples"] == 8 and "accuracy" in drift and drift["accuracy_delta"] == 0.0
    )  # fp32 eager is the reference
    reference = torch.load(workdir / "studies" / "img" / "reference" / "reference.pt", weights_only=True)
    assert reference["inputs"][0].shape == (8, 3, 16, 16) and reference["calibration"][0].shape == (
        4,
        3,
        16,
        16,
    )  # batches: one tensor per input
    assert set(reference["labels"].tolist()) <= {0, 1}


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--data", "missing"], "--data 'missing' does not exist"),
        (["--data", "DATA"], "samples have shape 1x8x8, the model's input is 3x16x16"),
        (["--drift-metric", "accuracy"], "--drift-metric accuracy needs labels"),
        (["--max-drift", "abc"], "cannot read the drift bound 'abc'"),
        (["--max-drift", "5%"], "a % bound applies to accuracy and perplexity only"),
        (["--data", "DATA_FEW", "--eval-samples", "8", "--calibration-samples", "8"], "--data has 10 samples"),
    ],
)
def test_bad_data_input_is_one_line_and_exit_2(cli, workdir, extra, message):
    torch.save({"inputs": torch.rand(20, 1, 8, 8), "labels": torch.zeros(20, dtype=torch.long)}, workdir / "d.pt")
    torch.save(torch.rand(10, 3, 16, 16), workdir / "few.pt")
    extra = [{"DATA": str(workdir / "d.pt"), "DATA_FEW": str(workdir / "few.pt")}.get(a, a) for a in extra]
    result = cli("search", "--model", tiny(), "--input-shape", "3x16x16", *extra, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr

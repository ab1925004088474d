"""A FP32 reference whose outputs are the same for every input (a zero-initialised head) makes drift
blind: every candidate's drift is 0, broken numerics included. These tests run the real reference
process, trials and CLI on the tiny models of degenerate_models.py."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TESTS, load_study

from autotune.machine.probe import probe_machine
from autotune.measure.drift import constant_across_samples
from autotune.measure.stopwatch import MeasureSettings
from autotune.model.head import find_layers, redraw_zero_weights
from autotune.model.sources import ModelSource
from autotune.records.best import BestJson
from autotune.records.config import TrialConfig
from autotune.runner.trials import TrialContext, compute_reference, run_config

MODELS = TESTS / "degenerate_models.py"
QUICK = MeasureSettings(warmup_min_iters=2, warmup_min_s=0.1, window_min_s=0.3, window_min_iters=3, window_max_s=5)


def model(name: str) -> str:
    return f"{MODELS}:{name}"


def search(searcher, model_args: list[str], *extra: str, precisions=("fp32",)):
    """`model_args`: --model MODEL and what goes with it (--weights)."""
    flag, model, *with_model = model_args
    assert flag == "--model", model_args
    space = searcher.space(
        batch_size=[4], backends={"eager": {"precision": list(precisions), "memory_format": ["contiguous"]}}
    )
    return searcher.search(*with_model, *extra, model=model, space=space)


def test_constant_outputs_are_told_apart_from_varying_ones():
    rng = np.random.default_rng(0)
    varying = rng.normal(size=(4, 10))
    assert not constant_across_samples(varying)
    assert constant_across_samples(np.zeros((4, 10)))
    assert constant_across_samples(np.tile(varying[0], (4, 1)))  # the same non-zero answer for every input
    assert constant_across_samples(np.tile(varying[0], (4, 1)) * (1 + 1e-8 * rng.normal(size=(4, 1))))  # rounding
    assert not constant_across_samples(np.tile(varying[0], (4, 1)) * (1 + 1e-3 * rng.normal(size=(4, 1))))
    assert constant_across_samples(np.zeros((1, 10))) and not constant_across_samples(varying[:1])  # one sample
    assert not constant_across_samples(np.full((4, 10), np.nan))  # not finite: another problem, not this one


def test_the_layer_before_a_zero_head_is_found_and_the_head_redrawn_the_same_each_time():
    from degenerate_models import tiny_vit

    samples = [(torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(i)),) for i in range(3)]
    vit = tiny_vit().eval()
    layers = find_layers(vit, samples, constant_across_samples)
    assert layers.varying == "encoder" and layers.head == ["heads", "heads.head"]
    assert redraw_zero_weights(vit, layers.head) == ["heads.head.weight"]  # the bias stays zero
    again = tiny_vit()
    redraw_zero_weights(again, layers.head)
    assert torch.equal(vit.heads.head.weight, again.heads.head.weight) and vit.heads.head.weight.abs().min() > 0
    assert not torch.any(vit.heads.head.bias)
    with torch.no_grad():
        outputs = torch.cat([vit(*s) for s in samples]).numpy()
    assert not constant_across_samples(outputs)


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_an_int8_artifact_drifts_from_the_redrawn_reference(backend, tmp_path):
    """An artifact backend runs the model built from the weights the reference saved: its int8 drift
    is no longer the 0 that any numerics got against the zero head."""
    source = ModelSource("factory", model("zero_head"), (3, 16, 16))
    reference = compute_reference(source, tmp_path / "study", eval_samples=6, timeout_s=120)
    seen = []

    class Stop(Exception):
        pass

    def on_stage(stage, payloads):
        if stage == "ready":  # after "prepared": the artifact is built
            seen.extend(payloads)
            raise Stop

    ctx = TrialContext(probe_machine(), reference, QUICK, tmp_path / "cache")
    with pytest.raises(Stop):
        run_config(TrialConfig(backend, "int8", 2), ctx, tmp_path / "trial", 120, on_stage=on_stage)
    drift = seen[0]["drift"]
    assert 0 < drift["relative_l2"] < 1, drift  # the int8 error of the features, seen through the head
    assert reference.note.redrawn == ["head.weight"] and reference.model.weights_path  # the init trials load


def test_a_zero_head_no_longer_hides_broken_numerics(searcher, workdir):
    """The model's bf16 path is broken on purpose (negated features). Behind a zero head the old
    reference gave it drift 0 and it completed; now it is pruned, and the note says why drift is
    measured where it is, on the first lines and in best.json (the closest candidate's: nothing met
    the bound, so no timing, and no noisy machine, decides what the file holds)."""
    result = search(searcher, ["--model", model("zero_head")], "--trials", "1", precisions=("bf16",))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (note,) = [i for i, line in enumerate(lines) if line.startswith("note: the FP32 outputs are all zero")]
    assert note <= 3 and "features before it (the output of 'features')" in lines[note]
    assert "redraw of head.weight" in lines[note]

    (broken,) = load_study(workdir, "s").trials
    assert broken.user_attrs["config"]["precision"] == "bf16" and broken.state.name == "PRUNED"
    assert broken.user_attrs["drift"]["relative_l2"] > 1.5  # ~2: the negated features, through the redrawn head

    best = BestJson.read(workdir / "studies" / "s" / "best.json")
    assert not best.meets_drift and best.trial == broken.number
    reference = best.reference_note
    assert reference is not None and reference.constant_outputs and reference.drift_measurable
    assert reference.varying_layer == "features" and reference.redrawn == ["head.weight"]
    assert f"note: {reference.message}" == lines[note]


def test_an_informative_reference_carries_no_note(tmp_path):
    source = ModelSource("factory", f"{TESTS / 'tiny_models.py'}:tiny_cnn", (3, 16, 16))
    reference = compute_reference(source, tmp_path, eval_samples=4, timeout_s=120)
    assert reference.note is None
    assert json.loads((tmp_path / "reference" / "meta.json").read_text())["result"]["reference_note"] is None


def zero_head_weights(workdir: Path) -> list[str]:
    from degenerate_models import zero_head

    torch.save(zero_head().state_dict(), workdir / "w.pt")
    return ["--model", model("zero_head"), "--weights", str(workdir / "w.pt")]


def zero_head_torchscript(workdir: Path) -> list[str]:
    from degenerate_models import zero_head

    torch.jit.save(torch.jit.trace(zero_head().eval(), torch.randn(2, 3, 16, 16)), workdir / "m.pt")
    return ["--model", str(workdir / "m.pt")]


@pytest.mark.parametrize(
    "arguments,expected",
    [
        (lambda workdir: ["--model", model("ignores_input")], "no layer's output depends on the input"),
        (zero_head_weights, "leave --weights out"),
        (zero_head_torchscript, "save the model file with a trained head"),
    ],
    ids=["no-layer-varies", "own-weights", "model-file"],
)
def test_a_reference_drift_cannot_see_past_is_refused(searcher, workdir, arguments, expected):
    """No layer varies, or the constant head is in the user's own weights (not autotune's to change):
    a drift-bounded search would pass any numerics, so it is refused, in one line."""
    result = search(searcher, arguments(workdir), "--trials", "1")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "drift cannot tell a broken numerics from a correct one" in result.stderr and expected in result.stderr
    assert len(load_study(workdir, "s").trials) == 0

"""Drift metrics and the criterion that bounds them, on arrays whose answers are known."""

import math

import numpy as np
import pytest

from autotune.measure.drift import DriftCriterion, compute_drift

REFERENCE = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 4.0], [5.0, 1.0, 0.0]])
LABELS = np.array([0, 1, 2, 1])  # the reference gets 3 of 4 right


def test_identical_outputs_have_no_drift():
    drift = compute_drift(REFERENCE, REFERENCE, LABELS)
    assert drift.relative_l2 == 0.0 and drift.cosine_similarity == pytest.approx(1.0) and drift.top1_agreement == 1.0
    assert drift.accuracy == drift.reference_accuracy == 0.75 and drift.accuracy_delta == 0.0


def test_one_flipped_sample_costs_agreement_and_accuracy():
    outputs = REFERENCE.copy()
    outputs[0] = [0.0, 2.0, 1.0]  # sample 0 (correct in FP32) now predicts class 1
    drift = compute_drift(outputs, REFERENCE, LABELS)
    assert drift.top1_agreement == 0.75 and drift.accuracy == 0.5 and drift.accuracy_delta == -0.25
    assert 0 < drift.cosine_similarity < 1 and drift.relative_l2 > 0
    assert DriftCriterion("accuracy", 0.2).drop(drift) == pytest.approx(0.25)
    assert DriftCriterion("accuracy", 0.2).exceeded(drift) and not DriftCriterion("accuracy", 0.3).exceeded(drift)
    assert DriftCriterion("accuracy", 0.3, relative=True).drop(drift) == pytest.approx(0.25 / 0.75)
    assert DriftCriterion("top1", 0.3).drop(drift) == pytest.approx(0.25)


def test_scaled_embeddings_keep_cosine_but_not_l2():
    drift = compute_drift(REFERENCE * 2, REFERENCE)
    assert drift.cosine_similarity == pytest.approx(1.0) and drift.relative_l2 == pytest.approx(1.0)
    assert not DriftCriterion("cosine", 1e-6).exceeded(drift) and DriftCriterion("relative_l2", 0.5).exceeded(drift)
    assert drift.accuracy is None and DriftCriterion("accuracy", 0.01).exceeded(
        drift
    )  # no labels: cannot be told, so not kept


def test_non_finite_outputs_always_exceed():
    drift = compute_drift(np.full_like(REFERENCE, np.nan), REFERENCE, LABELS)
    assert math.isinf(drift.relative_l2) and drift.accuracy == 0.0
    assert all(DriftCriterion(m, 0.99).exceeded(drift) for m in ("relative_l2", "cosine", "top1"))


@pytest.mark.parametrize(
    "metric,text,expected",
    [("relative_l2", "0.05", (0.05, False)), ("accuracy", "1%", (0.01, True)), ("accuracy", "0.01", (0.01, False))],
)
def test_bounds_are_absolute_or_relative(metric, text, expected):
    criterion = DriftCriterion.parse(metric, text)
    assert (criterion.max_drop, criterion.relative) == expected


@pytest.mark.parametrize("metric,text", [("relative_l2", "1%"), ("accuracy", "-1"), ("bleu", "0.1"), ("top1", "x")])
def test_bad_bounds_are_refused(metric, text):
    with pytest.raises(ValueError):
        DriftCriterion.parse(metric, text)


def test_an_all_zero_candidate_has_no_cosine_agreement_with_a_real_reference():
    drift = compute_drift(np.zeros_like(REFERENCE), REFERENCE)
    assert drift.cosine_similarity == 0.0 and DriftCriterion("cosine", 0.05).exceeded(drift)
    both_zero = compute_drift(np.zeros_like(REFERENCE), np.zeros_like(REFERENCE))
    assert both_zero.cosine_similarity == 1.0  # identical (zero) outputs do agree


def test_a_missing_drift_record_never_passes_the_bound():
    assert DriftCriterion().exceeded(None) and DriftCriterion("cosine", 0.5).exceeded(None)


def test_kl_divergence_is_llama_perplexitys_mean_kld_of_the_next_token_distributions():
    """Mean over positions of KL(FP32 || candidate) of the softmaxes, in nats, as torch computes it; zero for
    the same logits, growing with the perturbation; `--drift-metric kld` bounds it."""
    import torch

    from autotune.measure.drift import compute_generation_drift, mean_kl_divergence

    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(300, 1000, generator=generator, dtype=torch.float64) * 3
    small = reference + 0.05 * torch.randn(300, 1000, generator=generator, dtype=torch.float64)
    large = reference + 0.5 * torch.randn(300, 1000, generator=generator, dtype=torch.float64)
    expected = torch.nn.functional.kl_div(
        torch.log_softmax(small, -1), torch.log_softmax(reference, -1), log_target=True, reduction="batchmean"
    )
    got = mean_kl_divergence(small.numpy(), reference.numpy(), chunk=64)  # chunked as for a real vocabulary
    assert abs(got - float(expected)) < 1e-9 * max(1.0, float(expected))
    assert mean_kl_divergence(reference.numpy(), reference.numpy()) == 0.0
    assert got < mean_kl_divergence(large.numpy(), reference.numpy())
    drift = compute_generation_drift(small.numpy(), reference.numpy(), 10.0, 10.0, 1.0)
    assert drift.kl_divergence == pytest.approx(got)
    criterion = DriftCriterion.parse("kld", "0.01")
    assert criterion.drop(drift) == drift.kl_divergence and criterion.exceeded(drift) == (got > 0.01)
    broken = compute_generation_drift(small.numpy() * float("nan"), reference.numpy(), float("inf"), 10.0, 0.0)
    assert criterion.exceeded(broken)

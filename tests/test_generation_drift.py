"""Drift of a language model is measured on the graphs its timed calls run: the drift prompts have the
timed length and are generated `sequences` at a time, so a compiled trial compiles nothing for drift
that its timed window does not run (a teacher-forced pass of another shape did: inductor compiled it,
and recompiled the timed graphs with dynamic shapes). Every decode step is compared too, each fed FP32's
greedy token, so a candidate whose decode graph alone is off is caught."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TESTS

from autotune.backends.generation import Generator
from autotune.model.generation import DEFAULT_DRIFT_PROMPTS as DRIFT_ROWS
from autotune.model.generation import GenerationWorkload
from autotune.model.sources import ModelSource
from autotune.records.job import WorkerJob
from autotune.worker.generate import (
    GenerationRunner,
    drift_calls,
    measure_generation_drift,
    next_tokens,
    run_generation_reference,
)

PROMPT, NEW = 48, 6


class ShapeLog:
    """A forward that records the shape and strides of every input it is called with (a compiled graph
    guards on both), then runs the model's."""

    def __init__(self, model) -> None:
        self.model, self.shapes = model, set()

    def __call__(self, input_ids, **kwargs):
        self.shapes.add((tuple(input_ids.shape), input_ids.stride(), kwargs.get("use_cache")))
        return self.model.forward(input_ids=input_ids, **kwargs)


class LogitsWidth:
    """A forward that records how many positions' logits each call computed, then returns them."""

    def __init__(self, model) -> None:
        self.model, self.widths = model, []

    def __call__(self, input_ids, **kwargs):
        out = self.model.forward(input_ids=input_ids, **kwargs)
        self.widths.append(out.logits.shape[1])
        return out


class DecodeNoise:
    """A forward whose decode steps (one new token each) are off by noise of 10% of the logits' spread,
    and whose prefill is exact: what a candidate with a wrong decode graph looks like."""

    def __init__(self, model) -> None:
        self.model, self.generator = model, torch.Generator().manual_seed(0)

    def __call__(self, input_ids, **kwargs):
        out = self.model.forward(input_ids=input_ids, **kwargs)
        if input_ids.shape[1] == 1:
            noise = torch.randn(out.logits.shape, generator=self.generator) * out.logits.std() * 0.1
            out.logits = out.logits + noise
        return out


class FedLog:
    """A forward that records the token each decode step is fed, then runs the model's."""

    def __init__(self, model) -> None:
        self.model, self.fed = model, []

    def __call__(self, input_ids, **kwargs):
        if input_ids.shape[1] == 1:
            self.fed.append(input_ids[:, 0].clone())
        return self.model.forward(input_ids=input_ids, **kwargs)


def reference_job(tmp_path: Path, prompt: int = PROMPT, rows: int = DRIFT_ROWS) -> WorkerJob:
    source = ModelSource("factory", f"{TESTS / 'tiny_lm.py'}:tiny_llama", (prompt,))
    workload = GenerationWorkload(prompt_tokens=prompt, new_tokens=NEW, vocab_size=256, drift_prompts=rows)
    return WorkerJob(
        task="reference",
        model=source,
        generation=workload,
        weights_out=str(tmp_path / "weights.pt"),
        reference_path=str(tmp_path / "reference.pt"),
    )


def saved_model(tmp_path: Path) -> torch.nn.Module:
    from tiny_lm import tiny_llama

    model = tiny_llama().eval()
    model.load_state_dict(torch.load(tmp_path / "weights.pt", weights_only=True))
    return model


def reference(tmp_path: Path, prompt: int = PROMPT) -> tuple[Path, torch.nn.Module]:
    run_generation_reference(reference_job(tmp_path, prompt), torch.save)
    return tmp_path / "reference.pt", saved_model(tmp_path)


def test_every_row_is_evaluated_once_in_calls_of_the_timed_batch():
    assert drift_calls(4, 1) == [[0], [1], [2], [3]]
    assert drift_calls(4, 3) == [[0, 1, 2], [3, 0, 1]]
    assert drift_calls(4, 8) == [[0, 1, 2, 3, 0, 1, 2, 3]]


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
@pytest.mark.parametrize("sequences", [1, 3, 8])
def test_drift_runs_only_the_shapes_a_timed_call_runs(tmp_path, sequences, kv_cache):
    path, model = reference(tmp_path)
    drift_log, timed_log = ShapeLog(model), ShapeLog(model)
    generator = Generator(model, NEW, kv_cache, forward=drift_log)
    drift = measure_generation_drift(str(path), GenerationRunner(generator, {}), sequences)
    timed = Generator(model, NEW, kv_cache, forward=timed_log)
    timed.generate(torch.randint(0, 256, (sequences, PROMPT)))
    assert drift_log.shapes <= timed_log.shapes, f"drift ran {drift_log.shapes - timed_log.shapes}, never timed"
    if kv_cache == "static":  # one cache of the timed shape, reused: a compiled graph keeps its buffers
        assert list(generator._static) == [(sequences, PROMPT + NEW)]
    # The same FP32 model, whatever the batch: no drift, the same greedy tokens as the reference.
    assert drift.relative_l2 < 1e-4
    assert drift.greedy_agreement == 1.0
    assert abs(drift.perplexity_increase) < 1e-4
    assert drift.top1_agreement == 1.0


def test_a_timed_prefill_computes_the_last_positions_logits_only_and_drift_the_compared_ones(tmp_path):
    """The output layer is a prompt x vocabulary product: a timed call needs its last row only (as llama.cpp
    computes it); the drift pass keeps the compared positions. Every decode step computes one."""
    path, model = reference(tmp_path)
    timed = LogitsWidth(model)
    Generator(model, NEW, forward=timed).generate(torch.randint(0, 256, (2, PROMPT)))
    assert timed.widths == [1] * NEW
    drift = LogitsWidth(model)
    measure_generation_drift(str(path), GenerationRunner(Generator(model, NEW, forward=drift), {}), DRIFT_ROWS)
    assert drift.widths == [min(128, PROMPT)] + [1] * (NEW - 1)


def test_a_compiled_forwards_timed_prefill_keeps_the_drift_passs_positions(tmp_path):
    """A compiled forward (inductor) runs one prefill graph for drift and timing: the same logits width
    (another width is another graph, recompiled with the width symbolic in the timed one)."""
    path, model = reference(tmp_path)
    timed = LogitsWidth(model)
    Generator(model, NEW, forward=timed, compiled=True).generate(torch.randint(0, 256, (2, PROMPT)))
    drift = LogitsWidth(model)
    generator = Generator(model, NEW, forward=drift, compiled=True)
    measure_generation_drift(str(path), GenerationRunner(generator, {}), DRIFT_ROWS)
    assert timed.widths[0] == drift.widths[0] == min(128, PROMPT)
    assert timed.widths[1:] == drift.widths[1:] == [1] * (NEW - 1)


@pytest.mark.parametrize("rows", [DRIFT_ROWS, 7])
def test_reference_covers_the_drift_rows_at_the_timed_length(tmp_path, rows):
    """As many prompts as the workload's drift_prompts (--eval-samples), 4 when it does not say."""
    run_generation_reference(reference_job(tmp_path, rows=rows), torch.save)
    saved = torch.load(tmp_path / "reference.pt", weights_only=True)
    assert tuple(saved["prompts"].shape) == (rows, PROMPT)
    assert tuple(saved["greedy"].shape) == (rows, NEW)
    assert saved["logits"].shape[:2] == (rows, min(128, PROMPT) + NEW - 1)  # prefill, then each decode step


def test_reference_perplexity_is_over_the_prompts_last_positions_and_fp32s_generated_text(tmp_path, monkeypatch):
    """The kept logits predict the prompt's next ids over its last EVAL_LENGTH positions, then FP32's
    greedy tokens: what a plain forward over prompt + greedy text gives at those positions."""
    import autotune.worker.generate as generate

    monkeypatch.setattr(generate, "EVAL_LENGTH", 16)
    result = run_generation_reference(reference_job(tmp_path), torch.save)
    saved = torch.load(tmp_path / "reference.pt", weights_only=True)
    text = torch.cat([saved["prompts"], saved["greedy"]], dim=1)
    with torch.no_grad():
        logits = saved_model(tmp_path)(input_ids=text).logits[:, PROMPT - 16 : PROMPT + NEW - 1]
    targets = text[:, PROMPT - 16 + 1 :]
    assert torch.equal(targets, next_tokens(saved["prompts"], saved["greedy"], 16))
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1)).exp()
    assert result.reference_perplexity == pytest.approx(float(expected), rel=1e-4)
    assert torch.allclose(saved["logits"], logits, atol=1e-4)  # the cached decode steps are the plain forward's


def test_a_one_token_prompt_still_has_a_finite_perplexity(tmp_path):
    path, model = reference(tmp_path, prompt=1)
    drift = measure_generation_drift(str(path), GenerationRunner(Generator(model, NEW), {}), 1)
    assert 0 < drift.reference_perplexity < float("inf")
    assert abs(drift.perplexity_increase) < 1e-4


def test_a_candidate_whose_perplexity_is_past_a_floats_range_has_infinite_drift(tmp_path):
    """Logits thousands apart put the mean cross entropy past 709, where exp overflows: the candidate's
    perplexity is infinite and its drift judged (pruned), not an OverflowError that fails the trial."""
    path, model = reference(tmp_path)
    with torch.no_grad():
        model.lm_head.weight.mul_(1e5)
    drift = measure_generation_drift(str(path), GenerationRunner(Generator(model, NEW), {}), 2)
    assert drift.perplexity == float("inf") and drift.perplexity_increase == float("inf"), drift
    assert 0 < drift.reference_perplexity < float("inf")
    assert drift.relative_l2 > 1


def test_a_candidate_off_only_in_its_decode_steps_drifts(tmp_path):
    """Exact prefill, noisy decode steps: the prefill's logits alone show no drift at all."""
    path, model = reference(tmp_path)
    noisy = GenerationRunner(Generator(model, NEW, forward=DecodeNoise(model)), {})
    drift = measure_generation_drift(str(path), noisy, 2)
    assert drift.relative_l2 > 0.01, drift


def test_each_decode_step_is_fed_fp32s_token_not_the_candidates_own(tmp_path):
    """A candidate whose own greedy text differs from FP32's is still fed FP32's: its steps' logits
    are compared on the same text, and its greedy agreement counts the steps it would have chosen alike."""
    path, model = reference(tmp_path)
    with torch.no_grad():
        model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(1)))
    log = FedLog(model)
    drift = measure_generation_drift(str(path), GenerationRunner(Generator(model, NEW, forward=log), {}), 2)
    expected = torch.load(path, weights_only=True)["greedy"]
    own = Generator(model, NEW).generate(torch.load(path, weights_only=True)["prompts"], stamp=False)
    assert not torch.equal(own, expected)  # left to itself, the candidate writes another text
    steps = NEW - 1  # per call: calls of rows [0, 1] then [2, 3]
    fed = torch.cat([torch.stack(log.fed[:steps], dim=1), torch.stack(log.fed[steps:], dim=1)])
    assert torch.equal(fed, expected[:, :-1])
    assert drift.greedy_agreement < 1.0


def test_a_reference_of_an_older_format_is_refused_with_what_to_do(tmp_path):
    path, model = reference(tmp_path)
    saved = torch.load(path, weights_only=True)
    del saved["format"]
    torch.save(saved, path)
    with pytest.raises(ValueError, match=r"older format.*run the same `autotune search` command again"):
        measure_generation_drift(str(path), GenerationRunner(Generator(model, NEW), {}), 1)


def test_a_token_files_rows_of_the_prompt_length_are_the_prompts_each_once(tmp_path):
    """A 2-D token file whose rows are --prompt-tokens long: the drift prompts are its rows, each exactly once
    when as many are asked (never a window across two rows, as a flattened stream would give); more prompts
    than rows repeat them; rows of another length stay one stream of windows."""
    from autotune.model.generation import prompts

    rows = torch.arange(6 * 16).reshape(6, 16) % 256
    data = tmp_path / "rows.pt"
    torch.save(rows, data)
    workload = GenerationWorkload(16, 1, 256, 256, str(data))
    drawn = prompts(workload, 6, seed=1)
    assert sorted(tuple(r.tolist()) for r in drawn) == sorted(tuple(r.tolist()) for r in rows)
    assert torch.equal(drawn, prompts(workload, 6, seed=1))  # seeded
    more = prompts(workload, 9, seed=1)
    assert torch.equal(more[:6], drawn) and all(any(torch.equal(m, r) for r in rows) for m in more[6:])
    windows = prompts(GenerationWorkload(8, 1, 256, 256, str(data)), 40, seed=1)
    assert any(not any(torch.equal(w, r[:8]) or torch.equal(w, r[8:]) for r in rows) for w in windows)

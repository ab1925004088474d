"""Drift of a language model is measured on the graphs its timed calls run: the drift prompts have the
timed length and are generated `sequences` at a time, so a compiled trial compiles nothing for drift
that its timed window does not run (a teacher-forced pass of another shape did: inductor compiled it,
and recompiled the timed graphs with dynamic shapes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TESTS

from autotune.backends.generation import Generator
from autotune.model.generation import GenerationWorkload
from autotune.model.sources import ModelSource
from autotune.worker.generate import (
    DRIFT_ROWS,
    GenerationRunner,
    drift_calls,
    measure_generation_drift,
    run_generation_reference,
)

PROMPT, NEW = 48, 6


class ShapeLog:
    """A forward that records the shape of every input it is called with, then runs the model's."""

    def __init__(self, model) -> None:
        self.model, self.shapes = model, set()

    def __call__(self, input_ids, **kwargs):
        self.shapes.add((tuple(input_ids.shape), kwargs.get("use_cache")))
        return self.model.forward(input_ids=input_ids, **kwargs)


def reference(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    source = ModelSource("factory", f"{TESTS / 'tiny_lm.py'}:tiny_llama", (PROMPT,))
    workload = GenerationWorkload(prompt_tokens=PROMPT, new_tokens=NEW, vocab_size=256)
    job = {
        "model": source.to_dict(),
        "generation": workload.to_json(),
        "weights_out": str(tmp_path / "weights.pt"),
        "reference_path": str(tmp_path / "reference.pt"),
    }
    run_generation_reference(job, torch.save)
    from tiny_lm import tiny_llama

    model = tiny_llama().eval()
    model.load_state_dict(torch.load(tmp_path / "weights.pt", weights_only=True))
    return tmp_path / "reference.pt", model


def test_every_row_is_evaluated_once_in_calls_of_the_timed_batch():
    assert drift_calls(4, 1) == [[0], [1], [2], [3]]
    assert drift_calls(4, 3) == [[0, 1, 2], [3, 0, 1]]
    assert drift_calls(4, 8) == [[0, 1, 2, 3, 0, 1, 2, 3]]


@pytest.mark.parametrize("sequences", [1, 2, 8])
def test_drift_runs_only_the_shapes_a_timed_call_runs(tmp_path, sequences):
    path, model = reference(tmp_path)
    drift_log, timed_log = ShapeLog(model), ShapeLog(model)
    drift = measure_generation_drift(
        str(path), GenerationRunner(Generator(model, NEW, forward=drift_log), {}), sequences
    )
    timed = Generator(model, NEW, forward=timed_log)
    timed.generate(torch.randint(0, 256, (sequences, PROMPT)))
    assert drift_log.shapes <= timed_log.shapes, f"drift ran {drift_log.shapes - timed_log.shapes}, never timed"
    # The same FP32 model, whatever the batch: no drift, the same greedy tokens as the reference.
    assert drift.relative_l2 < 1e-4
    assert drift.greedy_agreement == 1.0
    assert abs(drift.perplexity_increase) < 1e-4
    assert drift.top1_agreement == 1.0


def test_reference_covers_the_drift_rows_at_the_timed_length(tmp_path):
    path, _ = reference(tmp_path)
    saved = torch.load(path, weights_only=True)
    assert tuple(saved["prompts"].shape) == (DRIFT_ROWS, PROMPT)
    assert tuple(saved["greedy"].shape) == (DRIFT_ROWS, NEW)
    assert saved["logits"].shape[:2] == (DRIFT_ROWS, min(128, PROMPT))

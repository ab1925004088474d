"""The generation side of a trial process: the FP32 reference of a language model, its candidate built
and converted, drift against the reference, and the token stamps TTFT and TPOT are read from.

One timed call is one generation: `sequences` prompts (the batch) prefilled, then decoded greedily to
exactly `new_tokens` tokens each. The stopwatch times calls as it does for any model; every token's
time is stamped too, so the orchestrator can split a call into its prefill (TTFT) and decode steps.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from autotune.measure.drift import Drift, compute_generation_drift
from autotune.model.generation import GenerationWorkload, prompts
from autotune.model.seeds import CALIBRATION_SEED, EVAL_SEED, TIMING_SEED
from autotune.model.sources import ModelSource, build_model
from autotune.records.config import TrialConfig
from autotune.worker.teardown import keep_until_exit

EVAL_SEQUENCES = 4
EVAL_LENGTH = 128  # teacher-forced positions per evaluation sequence (fewer when the prompt is shorter)
GREEDY_SEQUENCES = 2


def evaluation_ids(workload: GenerationWorkload) -> Any:
    """The text drift is measured on: windows of the data when given, else seeded random ids."""
    length = min(EVAL_LENGTH, workload.prompt_tokens + workload.new_tokens)
    return prompts(GenerationWorkload(length, 1, workload.vocab_size, workload.context, workload.data), 4, EVAL_SEED)


def perplexity(logits: Any, ids: Any) -> float:
    """exp of the mean next-token cross entropy of `ids` under teacher-forced `logits`."""
    import torch

    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return float(math.exp(float(loss)))


def run_generation_reference(job: dict[str, Any], save: Any) -> dict[str, Any]:
    """FP32 eager: teacher-forced logits and perplexity on the evaluation text, greedy tokens for the
    first prompts; saves the random init so every trial uses it."""
    import torch

    from autotune.backends.generation import Generator

    source = ModelSource.from_dict(job["model"])
    workload = GenerationWorkload.from_json(job["generation"])
    t0 = time.monotonic()
    model = keep_until_exit(build_model(source))
    if job.get("weights_out"):
        save(model.state_dict(), job["weights_out"])
    ids = evaluation_ids(workload)
    generator = Generator(model, workload.new_tokens)
    logits = generator.logits(ids)
    greedy_prompts = prompts(workload, GREEDY_SEQUENCES, EVAL_SEED + 1)
    greedy = generator.generate(greedy_prompts, stamp=False)
    save(
        {"ids": ids, "logits": logits, "greedy_prompts": greedy_prompts, "greedy": greedy},
        job["reference_path"],
    )
    return {
        "pid": os.getpid(),
        "output_shape": list(logits.shape),
        "seconds": time.monotonic() - t0,
        "torch": torch.__version__,
        "eval_samples": int(ids.numel()),
        "calibration_samples": 0,
        "labels": False,
        "reference_accuracy": None,
        "reference_perplexity": perplexity(logits, ids),
        "reference_note": None,  # logits over a vocabulary vary with the text: never a constant head
    }


def calibration_ids(workload: GenerationWorkload) -> Any:
    """Calibration text for SmoothQuant: data windows or seeded ids, disjoint seed from evaluation."""
    from autotune.backends.generation import CALIBRATION_LENGTH

    length = min(CALIBRATION_LENGTH, workload.prompt_tokens)
    return prompts(
        GenerationWorkload(length, 1, workload.vocab_size, workload.context, workload.data), 4, CALIBRATION_SEED
    )


class GenerationRunner:
    """The worker's view of a generator: `runner(prompts)` generates; `details` says what was built."""

    batches_per_call = 1

    def __init__(self, generator: Any, details: dict[str, Any]) -> None:
        from autotune.backends.precision import weight_probe

        self.generator = generator
        self.details = details
        self.probe = weight_probe(generator.model)  # what the layers run: their (quantized) weight types

    def __call__(self, input_ids: Any) -> Any:
        return self.generator.generate(input_ids)

    def convert_input(self, batch: Any) -> Any:
        return batch


def build_generation_runner(job: dict[str, Any], config: TrialConfig) -> GenerationRunner:
    """Build the model, convert it to the config's precision (timed apart) and wrap it."""
    from autotune.backends.generation import cached_artifact, prepare

    source = ModelSource.from_dict(job["model"])
    workload = GenerationWorkload.from_json(job["generation"])
    t0 = time.monotonic()
    model = build_model(source)  # not kept: a conversion may replace it, and the runner holds what it uses
    build_s = time.monotonic() - t0
    # Quantized once by the prepare step: only loaded here (quantized here if it was evicted since).
    artifact = cached_artifact(job["artifact_dir"]) if job.get("artifact_dir") else None
    calibration = (
        calibration_ids(workload) if config.precision == "smoothquant_int8" else None
    )  # a fallback may need it
    generator, details = prepare(model, config, workload.new_tokens, calibration, artifact)
    return GenerationRunner(
        generator, {**details, "build_s": build_s, "prompt_tokens": workload.prompt_tokens, "generation": True}
    )


def run_generation_prepare(job: dict[str, Any]) -> dict[str, Any]:
    """Quantize the language model once into the artifact folder (SmoothQuant calibrated on the
    calibration text), for every trial with the same numerics to load."""
    from autotune.backends.generation import build_artifact

    config = TrialConfig.from_dict(job["config"])
    workload = GenerationWorkload.from_json(job["generation"])
    t0 = time.monotonic()
    model = keep_until_exit(build_model(ModelSource.from_dict(job["model"])))
    calibration = calibration_ids(workload) if config.precision == "smoothquant_int8" else None
    out_dir = Path(job["artifact_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    details = build_artifact(model, calibration, config, out_dir)
    return {
        "pid": os.getpid(),
        "prepare_s": time.monotonic() - t0,
        "details": details,
        "calibration": {
            "data": "seeded token ids" if workload.data is None else workload.data,
            "samples": 0 if calibration is None else int(calibration.shape[0]),
        },
    }


def timing_prompts(job: dict[str, Any], config: TrialConfig, instance: int) -> Any:
    workload = GenerationWorkload.from_json(job["generation"])
    return prompts(workload, config.batch_size, TIMING_SEED + instance)


def measure_generation_drift(reference_path: str, runner: GenerationRunner) -> Drift:
    """Teacher-forced logits, perplexity and greedy tokens of the candidate against FP32 eager's."""
    import torch

    reference = torch.load(reference_path, weights_only=True)
    generator = runner.generator
    logits = generator.logits(reference["ids"])
    greedy = generator.generate(reference["greedy_prompts"], stamp=False)
    return compute_generation_drift(
        logits.numpy(),
        reference["logits"].numpy(),
        perplexity(logits, reference["ids"]),
        perplexity(reference["logits"], reference["ids"]),
        float((greedy == reference["greedy"]).float().mean()),
    )


def save_token_stamps(runner: Any, calls: int, new_tokens: int, path: str) -> None:
    """The stamps of the timed window's tokens (the last `calls` x `new_tokens`), one row per call."""
    stamps = np.frombuffer(runner.generator.token_stamps)[-calls * new_tokens :]
    np.save(path, stamps.reshape(calls, new_tokens))


def tokens_path(stamps_path: str) -> str:
    return str(Path(stamps_path).with_name(Path(stamps_path).name.replace("stamps-", "tokens-")))

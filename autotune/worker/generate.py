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
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from autotune.backends.generation.decode_loop import DRIFT_POSITIONS
from autotune.backends.generation.quantization import needs_calibration
from autotune.measure.drift import Drift, compute_generation_drift
from autotune.model.generation import REFERENCE_FORMAT, GenerationWorkload, prompts
from autotune.model.seeds import CALIBRATION_SEED, EVAL_SEED, TIMING_SEED
from autotune.model.sources import build_model
from autotune.records.config import TrialConfig
from autotune.records.job import WorkerJob
from autotune.records.metrics import PrepareResult
from autotune.records.reference import CalibrationSet, ReferenceResult
from autotune.worker.teardown import keep_until_exit

EVAL_LENGTH = DRIFT_POSITIONS  # prefill positions compared per prompt: its last ones (all of a shorter prompt)


def drift_prompts(workload: GenerationWorkload) -> Any:
    """The prompts drift is measured on (--eval-samples of them): as long as the timed ones, from the
    evaluation seed (the data's windows when given), so a trial evaluates them with the graphs its timed calls
    run; a trial of fewer sequences makes more calls, of more repeats them."""
    return prompts(workload, workload.prompts_for_drift, EVAL_SEED)


def drift_calls(rows: int, sequences: int) -> list[list[int]]:
    """The prompt rows of each drift call for a trial of `sequences` per call: every row at least once,
    each call exactly `sequences` rows (the timed shape), the rows in turn."""
    calls, start = [], 0
    while start < rows:
        calls.append([(start + offset) % rows for offset in range(sequences)])
        start += sequences
    return calls


def evaluate(generator: Any, ids: Any, sequences: int, forced: Any = None) -> tuple[Any, Any]:
    """Greedy tokens and the next-token logits at the last EVAL_LENGTH prompt positions and every decode
    step of each prompt row, generated `sequences` at a time (drift_calls; a row met twice keeps its first
    result); with `forced` (rows x new tokens), each decode step is fed its row's forced token."""
    rows = ids.shape[0]
    tokens = logits = None  # filled row by row in place: stacking copies would double the logits
    done: set[int] = set()
    for call in drift_calls(rows, sequences):
        fed = None if forced is None else forced[call]
        out, kept = generator.generate_with_logits(ids[call], compared_positions(ids), fed)
        if tokens is None or logits is None:
            tokens = out.new_empty((rows, *out.shape[1:]))
            logits = kept.new_empty((rows, *kept.shape[1:]))
        for place, row in enumerate(call):
            if row not in done:
                tokens[row], logits[row] = out[place], kept[place]
                done.add(row)
        del out, kept
    return tokens, logits


def compared_positions(ids: Any) -> int:
    """Prompt positions whose logits are compared: the last EVAL_LENGTH (all of a shorter prompt)."""
    return min(EVAL_LENGTH, ids.shape[1])


def next_tokens(ids: Any, greedy: Any, positions: int | None = None) -> Any:
    """The token each kept logit row predicts: the prompt's next ids over its last `positions` (default:
    compared_positions), then FP32's greedy tokens (the text every decode step is fed), so perplexity is
    finite for any prompt."""
    import torch

    positions = compared_positions(ids) if positions is None else positions
    return torch.cat([ids[:, ids.shape[1] - positions + 1 :], greedy], dim=1)


def perplexity(logits: Any, targets: Any) -> float:
    """exp of the mean cross entropy of `targets` under `logits` (aligned: one logit row per target);
    infinite past a float's range: a broken candidate's logits (inductor da8w8 on a Xeon with AMX: a mean
    cross entropy over 709) must be pruned on its drift, not fail the trial."""
    import torch

    loss = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)))
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def run_generation_reference(job: WorkerJob, save: Any) -> ReferenceResult:
    """FP32 eager: greedy tokens and the logits of the prefill and every decode step on the drift prompts,
    all rows in one call; saves the random init so every trial uses it."""
    import torch

    from autotune.backends.generation import Generator

    workload = job.workload()
    t0 = time.monotonic()
    model = keep_until_exit(build_model(job.model))
    if job.weights_out:
        save(model.state_dict(), job.weights_out)
    ids = drift_prompts(workload)
    greedy, logits = evaluate(Generator(model, workload.new_tokens), ids, ids.shape[0])
    save({"prompts": ids, "logits": logits, "greedy": greedy, "format": REFERENCE_FORMAT}, job.reference_path)
    return ReferenceResult(
        pid=os.getpid(),
        output_shape=list(logits.shape),
        seconds=time.monotonic() - t0,
        torch=torch.__version__,
        eval_samples=int(logits.shape[0] * logits.shape[1]),
        calibration_samples=0,
        labels=False,
        reference_perplexity=perplexity(logits, next_tokens(ids, greedy)),
        reference_note=None,  # logits over a vocabulary vary with the text: never a constant head
        reference_format=REFERENCE_FORMAT,
    )


def calibration_ids(workload: GenerationWorkload) -> Any:
    """Calibration text for SmoothQuant and a mix's ranking: data windows or seeded ids, disjoint seed from
    evaluation."""
    from autotune.backends.generation import CALIBRATION_LENGTH

    length = min(CALIBRATION_LENGTH, workload.prompt_tokens)
    # the workload's own reading of the data (a folder's tokenizer included), in shorter windows
    return prompts(replace(workload, prompt_tokens=length, new_tokens=1), 4, CALIBRATION_SEED)


class GenerationRunner:
    """The worker's view of a generator: `runner(prompts)` generates; `details` says what was built."""

    batches_per_call = 1

    def __init__(self, generator: Any, details: dict[str, Any]) -> None:
        from autotune.backends.generation.quantization import weight_probe

        self.generator = generator
        self.details = details
        # what the layers run: an engine's own probe (llama.cpp: its GGUF's tensor types), else the torch
        # module's (quantized) weight types
        self.probe = getattr(generator, "probe", None) or weight_probe(generator.model, details)

    def __call__(self, input_ids: Any) -> Any:
        return self.generator.generate(input_ids)

    def convert_input(self, batch: Any) -> Any:
        return batch


def build_generation_runner(job: WorkerJob, config: TrialConfig) -> GenerationRunner:
    """Build the model, convert it to the config's precision (timed apart) and wrap it."""
    from autotune.backends.generation import cached_artifact, prepare

    workload = job.workload()
    t0 = time.monotonic()
    model = build_model(job.model)  # not kept: a conversion may replace it, and the runner holds what it uses
    build_s = time.monotonic() - t0
    # Quantized once by the prepare step: only loaded here (quantized here if it was evicted since).
    artifact = cached_artifact(job.artifact_dir, config.backend) if job.artifact_dir else None
    calibration = calibration_ids(workload) if needs_calibration(config) else None  # a fallback may need it
    generator, details = prepare(model, config, workload.new_tokens, calibration, artifact)
    return GenerationRunner(
        generator, {**details, "build_s": build_s, "prompt_tokens": workload.prompt_tokens, "generation": True}
    )


def run_generation_prepare(job: WorkerJob) -> PrepareResult:
    """Quantize the language model once into the artifact folder (SmoothQuant calibrated on the
    calibration text), for every trial with the same numerics to load."""
    from autotune.backends.generation import build_artifact

    config = job.trial_config()
    workload = job.workload()
    t0 = time.monotonic()
    model = keep_until_exit(build_model(job.model))
    calibration = calibration_ids(workload) if needs_calibration(config) else None
    out_dir = Path(str(job.artifact_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    details = build_artifact(model, calibration, config, out_dir)
    return PrepareResult(
        pid=os.getpid(),
        prepare_s=time.monotonic() - t0,
        details=details,
        calibration=CalibrationSet(
            data="seeded token ids" if workload.data is None else workload.data,
            samples=0 if calibration is None else int(calibration.shape[0]),
        ),
    )


def timing_prompts(job: WorkerJob, config: TrialConfig, instance: int) -> Any:
    workload = job.workload()
    return prompts(workload, config.batch_size, TIMING_SEED + instance)


def measure_generation_drift(reference_path: str, runner: GenerationRunner, sequences: int) -> Drift:
    """Next-token logits (the prefill's last positions and every decode step, each step fed FP32's greedy
    token), perplexity and greedy tokens against FP32 eager's, on the drift prompts generated `sequences`
    at a time: the shapes and graphs the timed calls run."""
    import torch

    reference = torch.load(reference_path, weights_only=True)
    if reference.get("format") != REFERENCE_FORMAT:  # an exported best.json's reference from an older autotune
        raise ValueError(
            f"the FP32 reference {reference_path} holds drift outputs of an older format (autotune now measures "
            f"every decode step): run the same `autotune search` command again to compute it anew, then export"
        )
    ids, expected = reference["prompts"], reference["greedy"]
    greedy, logits = evaluate(runner.generator, ids, sequences, forced=expected)
    targets = next_tokens(ids, expected)
    return compute_generation_drift(
        logits.numpy(),
        reference["logits"].numpy(),
        perplexity(logits, targets),
        perplexity(reference["logits"], targets),
        float((greedy == expected).float().mean()),
    )


def save_token_stamps(runner: Any, calls: int, new_tokens: int, path: str) -> None:
    """The stamps of the timed window's tokens (the last `calls` x `new_tokens`), one row per call."""
    stamps = np.frombuffer(runner.generator.token_stamps)[-calls * new_tokens :]
    np.save(path, stamps.reshape(calls, new_tokens))


def tokens_path(stamps_path: str) -> str:
    return str(Path(stamps_path).with_name(Path(stamps_path).name.replace("stamps-", "tokens-")))

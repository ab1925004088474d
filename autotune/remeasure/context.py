"""What re-measuring an exported winner needs, from best.json alone."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autotune.common.json_record import RecordError
from autotune.machine.probe import probe_machine
from autotune.machine.runtimes import runtimes_with
from autotune.records.best import BestJson
from autotune.records.reference import CalibrationSet
from autotune.runner.trials import Reference, TrialContext


def context_from_best(best: BestJson) -> TrialContext:
    """The trial context of an exported winner: its reference, weights, measurement settings, caches and
    runtime, and in the server scenario its bound and arrivals (the search's first rates left out), or a
    language model's serving plan (requests, bounds, seed)."""
    job = best.job
    if job is None or job.reference_path is None or job.workdir is None:
        raise RecordError("best.json: its job lacks the reference, the work folder or the job itself")
    return TrialContext(
        probe_machine(),
        Reference(
            Path(job.reference_path),
            job.model,
            job.calibration or CalibrationSet(samples=job.calibration_samples),
            generation=job.generation,
        ),
        job.measure_settings(),
        Path(job.workdir),
        job.calibration_samples,
        runtimes=runtimes_with(best.runtime),
        server=replace(job.server, first_rates=None) if job.server else None,
        llm_server=job.llm_server,
    )

"""Files attached to the study as Optuna artifacts, so optuna-dashboard shows them next to the trials:
each trial's log (its launch commands, stdout and stderr of every process), best.json, the report.

They live in `studies/<study>/artifacts` (Optuna's FileSystemArtifactStore); `autotune dashboard`
serves that folder with the study.
"""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact

from autotune.common.files import tail, write_text_atomic
from autotune.records.attributes import TrialAttrs

LOG_CHARS = 20_000  # per process log: the end is what explains a failure


def artifact_folder(study_dir: Path) -> Path:
    return study_dir / "artifacts"


def artifact_store(study_dir: Path) -> FileSystemArtifactStore:
    folder = artifact_folder(study_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(str(folder))


def trial_log(trial_dir: Path, commands: list[str] | None, cause: str | None) -> str:
    """One readable log of a trial: what was run, and what every process of it printed."""
    parts = [f"trial folder: {trial_dir}"]
    if cause:
        parts.append(f"FAILED: {cause}")
    for i, command in enumerate(commands or []):
        parts.append(f"instance {i}: {command}")
    for log in sorted(p for p in trial_dir.rglob("*.log") if p.name != "trial.log"):
        text = tail(log, LOG_CHARS).rstrip()
        parts.append(f"==== {log.relative_to(trial_dir)} ====\n{text or '(empty)'}")
    return "\n\n".join(parts) + "\n"


def attach_trial_log(trial: optuna.trial.Trial, study_dir: Path, trial_dir: Path, attrs: TrialAttrs) -> None:
    """Write trial.log into the trial folder and upload it to the trial (best effort: never fails a trial)."""
    if not trial_dir.exists():
        return
    try:
        path = write_text_atomic(trial_dir / "trial.log", trial_log(trial_dir, attrs.commands, attrs.fail_cause))
        upload_artifact(
            artifact_store=artifact_store(study_dir), file_path=str(path), study_or_trial=trial, mimetype="text/plain"
        )
    except OSError:
        pass


def attach_to_study(study: optuna.study.Study, study_dir: Path, path: Path, mimetype: str) -> None:
    """Upload a study-level file (best.json, report.html)."""
    upload_artifact(
        artifact_store=artifact_store(study_dir), file_path=str(path), study_or_trial=study, mimetype=mimetype
    )

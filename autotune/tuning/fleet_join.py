"""`autotune join`: join an existing study from this machine, with the settings stored in the study.

In the code a process that runs a study's trials (`autotune search` or `autotune join`) is an
*orchestrator*; "worker" names only the trial process (`python -m autotune.worker`). The command keeps
its name, which fleet set-ups already use.

Nothing is typed again: model, space, drift bound and measurement settings come from the study; only
where it lives, this orchestrator's budget and the local studies folder come from the command line. Results
are only comparable between identical machines, so a machine whose hardware or software differs from
the one that created the study is refused unless `--allow-mixed-hardware`, which each trial records.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna

from autotune.common.errors import UserError
from autotune.common.json_record import JsonObject
from autotune.common.storage_urls import mask_url
from autotune.machine.fingerprint import fingerprint, fingerprint_differences
from autotune.machine.probe import probe_machine
from autotune.machine.runtimes import discover_runtimes
from autotune.records.attributes import Attr
from autotune.records.fingerprint import Fingerprint
from autotune.records.options import default_seconds
from autotune.records.spec import SearchSpec, StoredSpec
from autotune.tuning.storage import open_storage


def stored_spec(study_name: str, storage_url: str) -> tuple[JsonObject, Fingerprint | None]:
    """The settings and fingerprint the creating `autotune search` stored on the study."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url))
    except KeyError:
        raise UserError(
            f"no study {study_name!r} in {mask_url(storage_url)}: create it with 'autotune search' first"
        ) from None
    spec = study.user_attrs.get(Attr.SPEC)
    if not spec:
        raise UserError(f"study {study_name!r} was not created by 'autotune search': it holds no settings to join with")
    return spec, Fingerprint.of(study)


def _comparable(recorded: Fingerprint | None) -> JsonObject | None:
    """What makes timings comparable between two processes: how many CPUs they may use, not which ones
    (two workers of one host pinned to disjoint cores time alike), and not the kernel's patch level."""
    if recorded is None:
        return None
    hardware = recorded.hardware.to_json() if recorded.hardware else {}
    if "allowed_cpus" in hardware:
        hardware["allowed_cpus"] = f"{len(hardware['allowed_cpus'])} CPUs"
    software = recorded.software.to_json() if recorded.software else {}
    return {
        **recorded.to_json(),
        "hardware": hardware,
        "software": {k: v for k, v in software.items() if k != "kernel"},
    }


def joining_spec(
    study_name: str,
    storage_url: str,
    studies_root: Path,
    budget_s: float,
    trials: int | None,
    allow_mixed_hardware: bool,
    heartbeat_grace_s: float = default_seconds("heartbeat_grace"),
    finalists: int | None = None,
) -> SearchSpec:
    """This orchestrator's SearchSpec: the study's settings, this machine's folder, budget and storage URL."""
    stored, recorded = stored_spec(study_name, storage_url)
    recorded_spec = StoredSpec.from_json(stored)
    runtimes = discover_runtimes(recorded_spec.runtimes or ())
    here = Fingerprint.from_json(fingerprint(probe_machine(), runtimes))
    differences = fingerprint_differences(_comparable(recorded), _comparable(here) or {})
    if differences and not allow_mixed_hardware:
        raise UserError(
            f"this machine differs from the one that created study {study_name!r} ({'; '.join(differences)}): "
            "its timings would not compare; run on an identical machine, or pass --allow-mixed-hardware (recorded "
            "in each trial)"
        )
    spec = SearchSpec.from_json(
        {
            **stored,
            "storage": storage_url,
            "budget_s": budget_s,
            "trials": trials,
            "studies_root": str(studies_root.resolve()),
            "heartbeat_grace_s": heartbeat_grace_s,
            "finalists": recorded_spec.finalists if finalists is None else finalists,
        }
    )
    return replace(spec, mixed_hardware=differences or None)

"""The keys of what autotune keeps in Optuna's user attributes, on a study or on each of its trials.

Written and read through these names only, so a misspelt key is an AttributeError (and a mypy error),
not a silent None; the stored strings are unchanged, so studies written before read back the same.
"""

from __future__ import annotations


class Attr:
    """One constant per user-attribute key (the stored name, lower case)."""

    ATTENTION_LAYERS = "attention_layers"
    BASELINE = "baseline"
    BUDGET = "budget"
    CALIBRATION = "calibration"
    COMMANDS = "commands"
    CONFIG = "config"
    CONFIG_SUMMARY = "config_summary"
    COVERAGE = "coverage"
    COVERAGE_QUEUE = "coverage_queue"  # on the study: the coverage trials held back, released one at a time
    DEFERRED = "deferred"
    DRIFT = "drift"
    DRIFT_REFERENCE = "drift_reference"
    ENV = "env"
    EVALUATION = "evaluation"
    EXECUTED_PRECISION = "executed_precision"
    FAIL_CAUSE = "fail_cause"
    FALLBACK_KEY = "fallback_key"
    FINALISTS = "finalists"
    FINGERPRINT = "fingerprint"
    HOST = "host"
    JOB = "job"
    LATE_COVERAGE = "late_coverage"  # studies begun before the coverage queue: the late plans alone
    LAYOUT = "layout"
    LAYOUT_QUEUE = "layout_queue"  # on the study: the layout round's splits held back, released one at a time
    LAYOUT_ROUND = "layout_round"  # on the study: the leader's trial number, once the layout round's splits are held
    LAYOUT_ROUNDS_LATER = "layout_rounds_later"  # on the study: the leaders of the layout rounds after the first
    MEASUREMENT = "measurement"
    MEASURE_SETTINGS = "measure_settings"
    MIXED_HARDWARE = "mixed_hardware"
    MODEL_FOR_TRIALS = "model_for_trials"
    NUMERICS_KEY = "numerics_key"
    ORCHESTRATOR = "orchestrator"
    ORDER = "order"
    PINNING = "pinning"
    PIN_PREFIXES = "pin_prefixes"
    PREPARE_S = "prepare_s"
    PRIOR = "prior"
    PRUNE_REASON = "prune_reason"
    REDUCTION_DEPTH = "reduction_depth"
    REFERENCE_NOTE = "reference_note"
    RELEASED_LAST = "released_last"  # on the study: "layout" or "coverage", which queue released the last trial
    RETRIES = "retries"
    RETRY_OF = "retry_of"
    SCREENING = "screening"
    SEEDED = "seeded"
    SEQUENCES_ROUND = "sequences_round"  # generation: the trial given the most sequences, once enqueued (-1: none)
    SERVER = "server"
    SLO = "slo"
    SPEC = "spec"
    SPEED_GATE = "speed_gate"
    STDERR_TAIL = "stderr_tail"
    TOO_SLOW = "too_slow"
    TRIAL_DIR = "trial_dir"
    VALID = "valid"

"""The Python API: `autotune.search(...)` runs a study, `autotune.load("best.json")` gives the tuned model.

    import autotune
    result = autotune.search(model="my_models.py:build", input_shape="3x224x224", budget="20m")
    result.best.config, result.best.throughput_sps      # best.json as a typed record (autotune.records.best)

`search` takes the options of `autotune search` (the CLI is a thin layer over it). Trials run in fresh
processes, so the model is named, not passed: a torchvision name, a model file, "file.py:function" /
"module:function", or a factory function defined at the top level of a module (turned into such a
reference here); an nn.Module instance cannot travel to another process and is refused.

    # started by the exported launch script: ./launch.sh python serve.py
    infer = autotune.load()                  # best.json from AUTOTUNE_BEST, the model from its source
    outputs = infer(batch)                   # a tensor (or tuple of tensors) of the tuned batch size

The environment (allocator, OpenMP, threads) only takes effect when the process starts, so `load`
checks it instead of setting it, and says what differs and how to start the process right.

Heavy imports stay inside the functions: the CLI imports this module to start, and must start fast.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.common.errors import UserError
from autotune.measure.drift import DEFAULT_CLASSIFY_METRIC, DEFAULT_GENERATION_METRIC
from autotune.records.options import (
    DEFAULT_SPACE,
    GENERATION_SPACE,
    SERVING_SPACE,
    TASKS,
    Duration,
    PathArg,
    SearchOptions,
    flag,
)

if TYPE_CHECKING:
    import optuna
    from rich.console import Console

    from autotune.measure.drift import DriftCriterion
    from autotune.measure.stopwatch import MeasureSettings
    from autotune.model.dataset import DataSource
    from autotune.model.generation import GenerationWorkload
    from autotune.model.sources import ModelSource
    from autotune.records.best import BestJson
    from autotune.records.spec import SearchSpec

FACTORY_HINT = (
    "pass a factory function defined at the top level of a module (def build(): return MyNet()), or its "
    "reference as a string: 'path/to/file.py:build' or 'package.module:build'"
)


@dataclass
class Result:
    """What `autotune.search` found: the Optuna study (every trial, stored), the winner's best.json as a
    typed record (None when nothing was exported), where it was written, and whether Ctrl-C stopped it."""

    study: optuna.study.Study
    best: BestJson | None
    best_path: Path | None
    interrupted: bool = False


# ---- the model: named, since trials run in fresh processes -------------------------------------------------
def _in_memory(what: str, extra: str = "") -> UserError:
    return UserError(
        f"model: {what} cannot be searched: trials run in fresh processes, which cannot receive an in-memory "
        f"object; {FACTORY_HINT}{extra}"
    )


@functools.lru_cache(maxsize=8)
def _fresh_sys_path(cwd: str, pythonpath: str | None) -> frozenset[str]:
    """The import path of a fresh process of this interpreter started here (as trials are), resolved."""
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=cwd,
    )
    return frozenset(os.path.realpath(entry or cwd) for entry in json.loads(done.stdout))


def _importable_by_name(module_name: str, module_file: str) -> bool:
    """Whether a fresh trial process imports `module_name` from the same file (not only this process,
    whose sys.path a script or a test runner may have extended)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or os.path.realpath(spec.origin) != os.path.realpath(module_file):
        return False
    levels = module_name.count(".") + (1 if Path(spec.origin).name == "__init__.py" else 0)
    root = Path(os.path.realpath(spec.origin)).parents[levels]
    try:
        return str(root) in _fresh_sys_path(os.getcwd(), os.environ.get("PYTHONPATH"))
    except (OSError, subprocess.SubprocessError, ValueError):
        return False


def model_reference(model: PathArg | Callable[..., Any]) -> str:
    """What `--model` takes, for `model`: a string or path as it is; a factory (a function or class
    defined at the top level of a module) as "package.module:function" when a fresh process imports
    that module by name, else as "path/to/file.py:function". Anything held only in memory (an nn.Module
    instance, a lambda, a nested function, a bound method) raises UserError saying what to pass."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        raise _in_memory(
            f"an nn.Module instance ({type(model).__name__})",
            " (trained weights: torch.save(model.state_dict(), 'weights.pt') and pass weights='weights.pt')",
        )
    if not callable(model):
        raise UserError(
            f"model must be a torchvision model name, a model file, a 'file.py:function' reference or a factory "
            f"function, got {type(model).__name__}"
        )
    if inspect.ismethod(model):
        raise _in_memory(f"the bound method {model.__qualname__}")
    name, qualname = getattr(model, "__name__", None), getattr(model, "__qualname__", None)
    if name == "<lambda>":
        raise _in_memory("a lambda")
    if not (inspect.isfunction(model) or inspect.isclass(model)) or not isinstance(name, str):
        raise _in_memory(f"a {type(model).__name__} object")
    if qualname != name:
        where = "inside a function" if "<locals>" in (qualname or "") else "inside a class"
        raise _in_memory(f"{qualname}, defined {where},")
    module_name = model.__module__
    module = sys.modules.get(module_name)
    if module is None or getattr(module, name, None) is not model:
        raise _in_memory(f"{name} (not reachable as {module_name}.{name})")
    module_file = getattr(module, "__file__", None)
    if not module_file or not module_file.endswith(".py") or not os.path.isfile(module_file):
        raise _in_memory(f"{name}, defined in {module_name} which has no .py file (an interactive session?),")
    if module_name == "__main__":  # a script, or `python -m package.module`
        main_spec = getattr(module, "__spec__", None)
        module_name = main_spec.name if main_spec is not None else "__main__"
    if module_name != "__main__" and _importable_by_name(module_name, module_file):
        return f"{module_name}:{name}"
    return f"{Path(module_file).resolve()}:{name}"


def _refuse_nested_search() -> None:
    """A script that calls autotune.search outside `if __name__ == "__main__":` would run it again when its
    factory is imported (to read its example inputs, and in every trial process): refuse that."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_import_factory" and frame.f_globals.get("__name__") == "autotune.model.sources":
            raise UserError(
                "autotune.search was called while the model's module was being imported (to build the model, here "
                'or in a trial process): call it under `if __name__ == "__main__":` in your script, or keep the '
                "factory in a module of its own"
            )
        frame = frame.f_back  # type: ignore[assignment]


# ---- the settings ------------------------------------------------------------------------------------------
def measure_window(value: Duration) -> tuple[float, float | None]:
    """--measure-seconds MIN or MIN-MAX ("5s", "0.3s-2s"): the window's minimum and, when given, the
    longest it may grow to while its interval is wider than the target."""
    text = str(value)
    low, sep, high = text.partition("-") if not isinstance(value, (int, float)) else (text, "", "")
    window = seconds(low if sep else value)
    if not sep:
        return window, None
    cap = seconds(high)
    if cap < window:
        raise UserError(f"{flag('measure_seconds')} {text}: the longest window must not be shorter than the shortest")
    return window, cap


def measure_settings(
    window_s: float, min_iterations: int = 5, cap_s: float = 0.0, max_s: float | None = None
) -> MeasureSettings:
    """The measurement window from the user's --measure-seconds: at most 4x its minimum (at least +10 s),
    or the maximum the user gave."""
    from autotune.measure.stopwatch import MeasureSettings

    return MeasureSettings(
        window_min_s=window_s,
        window_min_iters=min_iterations,
        window_max_s=max_s if max_s is not None else max(window_s * 4, window_s + 10, cap_s),
        warmup_min_s=min(1.0, window_s),
        screen_s=min(1.0, window_s / 2),
    )


def seconds(value: Duration) -> float:
    """A duration as the CLI takes it ("90s", "20m", "2h", "1h30m"), or a number of seconds."""
    from autotune.common.durations import parse_duration

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise UserError(f"duration {value!r} must be positive")
        return float(value)
    return parse_duration(str(value))


def heartbeat_grace_s(value: Duration) -> float:
    grace = seconds(value)
    if grace < 2:
        raise UserError(f"{flag('heartbeat_grace')} must be at least 2s, got {value}")
    return grace


def _input_shape(value: str | Sequence[int] | None) -> str | None:
    """--input-shape as given, or a shape as a sequence of ints: (3, 224, 224) -> "3x224x224"."""
    if value is None or isinstance(value, str):
        return value
    return "x".join(str(int(d)) for d in value)


def _optional_path(value: PathArg | None) -> str | None:
    return None if value is None else os.fspath(value)


def _resolve_model_source(
    reference: str,
    weights: str | None,
    input_shape: str | None,
    allow_pickle: bool,
    console: Console,
    trust_remote_code: bool = False,
) -> ModelSource:
    """The model, checked; the first line printed says where its weights come from."""
    from autotune.model.inputs import describe as describe_inputs
    from autotune.model.sources import resolve_model

    model = resolve_model(reference, weights, input_shape, allow_pickle, trust_remote_code)
    origin = {
        "random-init": f"RANDOM INIT (no {flag('weights')} given and none in the torch hub cache)",
        "torch-hub-cache": f"pretrained weights from the torch hub cache: {model.weights_path}",
        "weights-file": f"weights from {model.weights_path}",
        "model-file": "weights inside the model file",
        "hf-folder": f"a Hugging Face folder ({model.task}), its weights (sha256 {(model.weights_sha256 or '')[:12]})",
    }[model.weights_origin]
    console.print(f"model {model.name} input {describe_inputs(model.specs)}: {origin}", markup=False)
    return model


def default_drift_metric(chosen: str | None, generates: bool) -> str:
    """The metric --max-drift bounds: the one chosen, else the one the task's users read. For text,
    llama-perplexity's mean KL divergence (its published tables rank every quantization type by it); for a
    classifier, the relative L2 of the logits."""
    if chosen:
        return chosen
    return DEFAULT_GENERATION_METRIC if generates else DEFAULT_CLASSIFY_METRIC


def default_eval_samples(chosen: int | None, generates: bool) -> int:
    """What drift is measured on: the number chosen, else a classifier's evaluation set of 32 inputs or a
    language model's 4 prompts (every trial evaluates each prompt's last positions and every decode step)."""
    from autotune.model.generation import DEFAULT_DRIFT_PROMPTS
    from autotune.records.options import DEFAULT_EVAL_SAMPLES

    if chosen is not None:
        if chosen < 1:
            raise UserError(f"{flag('eval_samples')} must be at least 1, got {chosen}")
        return chosen
    return DEFAULT_DRIFT_PROMPTS if generates else DEFAULT_EVAL_SAMPLES


def _drift_criterion(drift_metric: str, max_drift: str | float) -> DriftCriterion:
    from autotune.measure.drift import DriftCriterion

    try:
        return DriftCriterion.parse(drift_metric, str(max_drift))
    except ValueError as exc:
        raise UserError(f"{flag('max_drift')}: {exc}") from None


def _resolve_drift_data(
    model: ModelSource,
    data: str | None,
    calibration_data: str | None,
    eval_samples: int,
    calibration_samples: int,
    console: Console,
) -> tuple[DataSource, DataSource | None]:
    """The drift (and calibration) data, checked to hold both sets; says what drift is measured on."""
    from autotune.model.dataset import check_sizes, resolve_data

    resolved = resolve_data(data, model.specs)
    calibration = resolve_data(calibration_data, model.specs, flag("calibration_data")) if calibration_data else None
    check_sizes(resolved, calibration, eval_samples, calibration_samples)
    if resolved.kind == "synthetic":
        console.print(
            f"warning: no {flag('data')}: drift is measured on synthetic random inputs, so it says little about "
            f"accuracy; pass {flag('data')} (an image folder or a tensor file) to keep your accuracy",
            markup=False,
        )
    else:
        console.print(
            f"data: {resolved.describe()}; calibration: "
            f"{calibration.describe() if calibration else 'a disjoint split of it'}",
            markup=False,
        )
    return resolved, calibration


def _generation_workload(
    reference: str,
    task: str,
    prompt_tokens: int,
    new_tokens: int,
    data: str | None,
    weights: str | None,
    input_shape: Any,
    trust_remote_code: bool = False,
) -> GenerationWorkload | None:
    """The generation workload when the model is to generate text (--task generate, or auto and the
    factory returns a causal language model); None for a forward-pass study."""
    from autotune.model import hf_folder
    from autotune.model.generation import (
        SEQUENCES_TOTAL,
        GenerationWorkload,
        check_workload,
        language_model_info,
        read_token_data,
    )
    from autotune.model.sources import MODEL_FILE_SUFFIXES, build_model, resolve_model

    if task not in TASKS:
        raise UserError(f"{flag('task')} {task!r} is not known; choose {', '.join(TASKS)}")
    factory = ":" in reference and not reference.endswith(MODEL_FILE_SUFFIXES)
    tokenizer = None
    if hf_folder.is_folder(reference):
        held = hf_folder.read_folder(reference, trust_remote_code)
        if task not in ("auto", held.task):
            raise UserError(
                f"{flag('task')} {task}: model folder {reference!r} holds a {held.architecture}, which autotune "
                f"times on {held.task}; drop {flag('task')}"
            )
        if held.task == "classify":
            return None
        task, factory = "generate", True
        if hf_folder.has_tokenizer(held.path):
            hf_folder.check_tokenizer(held, reference)
            tokenizer = str(held.path)
    if task == "classify" or (task == "auto" and (not factory or input_shape is not None)):
        return None
    if not factory:
        raise UserError(
            f"{flag('task')} generate needs a Hugging Face model folder or a factory returning a causal language "
            f"model (file.py:function), got {reference!r}"
        )
    check_workload(GenerationWorkload(prompt_tokens, new_tokens), None, reference)
    # torch logs deprecation notices when torchao registers its types: not for the user's terminal.
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    source = resolve_model(reference, weights, "input_ids:int64:1:0-2", False, trust_remote_code)
    try:
        model = build_model(source)
    except Exception as exc:
        raise UserError(f"model {reference!r}: the factory failed ({type(exc).__name__}: {exc})") from None
    info = language_model_info(model)
    if info is None:
        if task == "auto":
            return None
        raise UserError(
            f"{flag('task')} generate needs a causal language model: {reference} returns a {type(model).__name__}, "
            f"which has no config.vocab_size and no generate(); drop {flag('task')} generate to tune its forward pass"
        )
    workload = GenerationWorkload(
        prompt_tokens,
        new_tokens,
        info.vocab_size,
        info.context,
        str(Path(data).resolve()) if data else None,
        SEQUENCES_TOTAL,
        tokenizer,
    )
    check_workload(workload, info, reference)
    if data:
        read_token_data(data, info.vocab_size, tokenizer)  # refused now, in one line, rather than in every trial
    return workload


def _with_sequences(space: dict[str, Any], sequences: Sequence[int] | None) -> dict[str, Any]:
    """--sequences overrides the space's list of total concurrent sequences (split across instances)."""
    if sequences is None:
        return space
    values = list(sequences)
    if not values or any(int(v) < 1 for v in values):
        raise UserError(f"{flag('sequences')} must be positive counts, e.g. 1,2,4 (got {values})")
    baseline = dict(space.get("baseline") or {})
    if baseline.get("sequences") not in values:
        baseline["sequences"] = values[0]
    return {**space, "sequences": [int(v) for v in values], "baseline": baseline}


def _say_generation(workload: GenerationWorkload, console: Console) -> None:
    """The first lines of a generation study: what one call generates, and what drift is measured on."""
    console.print(
        f"task: generate, prompt {workload.prompt_tokens} tokens, {workload.new_tokens} new tokens per sequence "
        f"(greedy, no early stop); vocabulary {workload.vocab_size}, context {workload.context or 'unknown'}",
        markup=False,
    )
    if workload.data:
        tensor = Path(workload.data).suffix in (".pt", ".pth")
        encoded = (
            "token ids"
            if tensor
            else "the model's tokenizer's ids"
            if workload.tokenizer
            else "UTF-8 bytes folded into the vocabulary (no tokenizer)"
        )
        console.print(
            f"data: {workload.data} as {encoded}: prompts and the text drift and perplexity are measured on",
            markup=False,
        )
    else:
        console.print(
            f"warning: no {flag('data')}: prompts and drift use random token ids, so perplexity says little; pass "
            f"{flag('data')} "
            "(a text file, or a tensor file of token ids) to bound perplexity on your text",
            markup=False,
        )


def search_spec(options: SearchOptions, console: Console | None = None) -> SearchSpec:
    """The options of `autotune search` (see `search`), validated into the SearchSpec a study runs with.

    Resolves the model and the data (printing where the weights come from and what drift is measured
    on); raises UserError, one line naming the option, on bad input."""
    from autotune.common.sizes import machine_memory_mib, parse_size_mib
    from autotune.machine.runtimes import interpreter_of
    from autotune.records.spec import SearchSpec, default_storage, validate_study_name

    _refuse_nested_search()
    console = console or default_console()
    reference = model_reference(options.model)
    study = validate_study_name(options.study or Path(reference.rpartition(":")[2]).stem or "model")
    window, window_cap = measure_window(options.measure_seconds)
    inputs = _resolve_inputs(options, reference, console)
    criterion = _drift_criterion(
        default_drift_metric(options.drift_metric, inputs.workload is not None), options.max_drift
    )
    objective = _scenario_objective(options.scenario, options.objective)
    pareto = objective == "pareto"
    offline_ttft = options.ttft_slo_ms is not None and objective == "throughput"  # a p99 over generations
    many_calls = (options.slo_ms is not None and objective == "throughput") or pareto or offline_ttft
    workload = inputs.workload
    studies_dir = os.fspath(options.studies_dir)
    return SearchSpec(
        study=study,
        model=inputs.source,
        storage=options.storage or os.environ.get("AUTOTUNE_STORAGE") or default_storage(studies_dir, study),
        space_path=str(inputs.space_path),
        space=inputs.space,
        objective=objective,
        max_drift=criterion.max_drop,
        drift_metric=criterion.metric,
        drift_relative=criterion.relative,
        data=inputs.drift_data,
        calibration_data=inputs.calibration,
        budget_s=seconds(options.budget),
        trials=options.trials,
        trial_timeout_s=seconds(options.trial_timeout),
        eval_samples=default_eval_samples(options.eval_samples, workload is not None),
        studies_root=str(Path(studies_dir).resolve()),
        calibration_samples=options.calibration_samples,
        cover_backends=options.cover_backends,
        measure=measure_settings(window, min_iterations=100 if many_calls else 5, max_s=window_cap),
        finalists=0 if pareto else options.finalists,
        finalist_repeats=options.finalist_repeats,
        finalist_share=options.finalist_share,
        # a language model's server: its offline screening (tokens/s) says nothing of a sustained request rate
        speed_pruning=options.speed_pruning and not pareto and not (workload and objective == "server"),
        runtimes=[str(interpreter_of(os.fspath(path))) for path in options.runtimes],
        memory_limit_mib=parse_size_mib(options.memory_limit, flag("memory_limit"), machine_memory_mib()),
        cache_size_mib=parse_size_mib(options.cache_size, flag("cache_size")),
        slo_ms=options.slo_ms,
        heartbeat_grace_s=heartbeat_grace_s(options.heartbeat_grace),
        task="generate" if workload else "classify",
        generation=workload,
        ttft_slo_ms=options.ttft_slo_ms,
        tpot_slo_ms=options.tpot_slo_ms,
    )


@dataclass
class _ResolvedInputs:
    """The model, the space and the data a study runs on, resolved from the options."""

    source: ModelSource
    space_path: Path
    space: dict[str, Any]
    drift_data: DataSource
    calibration: DataSource | None
    workload: GenerationWorkload | None


def _resolve_inputs(options: SearchOptions, reference: str, console: Console) -> _ResolvedInputs:
    """A language model's workload and token inputs, or a classifier's inputs and drift data; the space
    file for the task (the generation space for a language model)."""
    from autotune.model.dataset import DataSource
    from autotune.tuning.space import load_space_file

    weights = _optional_path(options.weights)
    workload = _generation_workload(
        reference,
        options.task,
        options.prompt_tokens,
        options.new_tokens,
        _optional_path(options.data),
        weights,
        options.input_shape,
        options.trust_remote_code,
    )
    if workload:
        from autotune.model.generation import DEFAULT_DRIFT_PROMPTS

        prompts = default_eval_samples(options.eval_samples, True)
        workload = replace(workload, drift_prompts=None if prompts == DEFAULT_DRIFT_PROMPTS else prompts)
    serving = workload and _scenario_objective(options.scenario, options.objective) == "server"
    default = (SERVING_SPACE if serving else GENERATION_SPACE) if workload else DEFAULT_SPACE
    space_path = Path(options.space or default)
    space = load_space_file(space_path)
    if workload:
        space = _with_sequences(space, options.sequences)
        token_inputs = f"input_ids:int64:{workload.prompt_tokens}:0-{workload.vocab_size}"
        source = _resolve_model_source(reference, weights, token_inputs, False, console, options.trust_remote_code)
        _say_generation(workload, console)
        return _ResolvedInputs(source, space_path, space, DataSource(), None, workload)
    if options.sequences is not None or options.ttft_slo_ms is not None or options.tpot_slo_ms is not None:
        raise UserError(
            f"{flag('sequences')}, {flag('ttft_slo_ms')} and {flag('tpot_slo_ms')} are for generation "
            f"({flag('task')} generate)"
        )
    source = _resolve_model_source(
        reference, weights, _input_shape(options.input_shape), options.allow_pickle, console, options.trust_remote_code
    )
    drift_data, calibration = _resolve_drift_data(
        source,
        _optional_path(options.data),
        _optional_path(options.calibration_data),
        default_eval_samples(options.eval_samples, False),
        options.calibration_samples,
        console,
    )
    return _ResolvedInputs(source, space_path, space, drift_data, calibration, None)


def _scenario_objective(scenario: str | None, objective: str) -> str:
    """--scenario offline|server|single-stream as the objective it measures; --objective alone keeps
    working, and the two must not disagree."""
    from autotune.records.spec import SCENARIOS

    if scenario is None:
        return objective
    if scenario not in SCENARIOS:
        raise UserError(f"{flag('scenario')} {scenario!r} is not known; choose {', '.join(SCENARIOS)}")
    wanted = SCENARIOS[scenario]
    if objective not in ("throughput", wanted):
        raise UserError(
            f"{flag('scenario')} {scenario} measures {wanted}, but {flag('objective')} {objective} was given: "
            "drop one of them"
        )
    return wanted


def default_console() -> Console:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


# ---- the search --------------------------------------------------------------------------------------------
def search(model: PathArg | Callable[..., Any], *, console: Console | None = None, **options: Any) -> Result:
    """Run (or resume) a study, as `autotune search` does, and return its Result.

    `model`: a torchvision classification model name, "path/to/file.py:function" or
    "package.module:function" (a function returning an nn.Module, or (model, example_inputs)), a
    TorchScript (.pt) or exported program (.pt2) file, or the factory function itself, defined at
    the top level of a module (trials run in fresh processes, which import it; an nn.Module instance
    is refused). Every other option is a field of `autotune.SearchOptions`, the CLI's option of the
    same name and default (--no-speed-pruning is speed_pruning=False, --no-cover-backends
    cover_backends=False, --runtime runtimes=[...]); durations are strings ("90s", "20m", "2h") or
    seconds; input_shape may be a tuple, (3, 224, 224). An unknown option raises UserError.
    Progress goes to `console` (default: a rich Console on stdout). Bad input raises UserError (its
    message names the CLI option); Ctrl-C stops the search cleanly and the Result says `interrupted`
    (the same call resumes the study). Runs in the main thread only (it handles SIGTERM and SIGHUP
    during the search, and puts the caller's handlers back after).
    """
    import signal
    import threading

    from autotune.records.best import BestJson
    from autotune.tuning.study import run_search

    if threading.current_thread() is not threading.main_thread():
        raise UserError("autotune.search must run in the main thread (it stops cleanly on Ctrl-C, SIGTERM and SIGHUP)")
    console = console or default_console()
    spec = search_spec(SearchOptions.from_keywords(model, options), console)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        outcome = run_search(spec, console)
    finally:  # run_search turns SIGTERM and SIGHUP into Ctrl-C; the caller's handlers come back after it
        for signum, handler in handlers.items():
            if handler is not None:  # None: not set from Python, cannot be put back
                signal.signal(signum, handler)
    best = BestJson.read(outcome.best_path) if outcome.best_path else None
    return Result(outcome.study, best, outcome.best_path, outcome.interrupted)


# ---- the tuned model ---------------------------------------------------------------------------------------
def _load_generator(
    settings: GenerationWorkload, config: Any, model: Any, artifact_dir: str | None = None
) -> Callable[..., Any]:
    """A generation winner as a callable: `generate(input_ids)` -> the new tokens (sequences x new_tokens),
    greedy, converted and compiled as tuned (the precision applied to `model` in place: the quantized
    weights the search prepared when they are still in the cache, else quantized here)."""
    from autotune.backends.generation import cached_artifact, prepare

    # `model` given by the caller: its weights are replaced by the search's quantized ones (same model).
    artifact = cached_artifact(artifact_dir, config.backend) if artifact_dir else None
    calibration = None
    if config.precision == "smoothquant_int8":  # should the cached weights not load
        from autotune.worker.generate import calibration_ids

        calibration = calibration_ids(settings)  # the text the search calibrated on
    generator, details = prepare(model, config, settings.new_tokens, calibration, artifact)

    def generate(input_ids: Any) -> Any:
        import numpy as np
        import torch

        ids = torch.from_numpy(input_ids) if isinstance(input_ids, np.ndarray) else input_ids
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
            raise TypeError("the tuned language model takes token ids: an integer tensor or array, sequences x tokens")
        return generator.generate(ids, stamp=False)

    generate.config = config  # type: ignore[attr-defined]
    generate.details = details  # type: ignore[attr-defined]
    return generate


class TunedEnvironmentMismatch(RuntimeError):
    """The process was not started with the environment the winner was tuned with."""


def environment_differences(best: BestJson) -> list[str]:
    """What this process's environment lacks of the tuned one (libraries preloaded, variables, threads)."""
    import torch

    from autotune.worker.checks import mapped_libraries

    differences = []
    mapped = {os.path.realpath(p) for p in mapped_libraries()}
    for name, value in (best.environment or {}).items():
        if name == "LD_PRELOAD":
            missing = [lib for lib in value.split(":") if lib and os.path.realpath(lib) not in mapped]
            differences += [f"{lib} is not preloaded" for lib in missing]
        elif name != "TORCHINDUCTOR_CACHE_DIR" and os.environ.get(name) != value:
            differences.append(f"{name}={os.environ.get(name)!r}, tuned with {value!r}")
    threads = best.config.threads_per_instance
    if torch.get_num_threads() != threads:
        differences.append(f"torch runs {torch.get_num_threads()} threads, tuned with {threads}")
    return differences


def load(
    best_path: str | os.PathLike[str] | None = None, model: Any = None, check_environment: bool = True
) -> Callable[..., Any]:
    """The winner of best.json as a callable: `infer(batch)` -> the model's outputs.

    `batch`: torch tensors or numpy arrays of the tuned batch size. Each call converts only what the
    backend cannot take as it is: a numpy array reaches ONNX Runtime or OpenVINO unchanged when it is
    C-contiguous float32 (or integer), a tensor reaches a torch backend unchanged when it is in the
    tuned memory format; across kinds the conversion is a zero-copy view.
    `model`: your nn.Module (default: rebuilt from the model source best.json records; artifact
    backends load their exported, converted or quantized file instead). Raises
    TunedEnvironmentMismatch when the process was not started as tuned (see the launch script).
    """
    from autotune.backends import BACKENDS, backend_module
    from autotune.model.inputs import as_batch, synthetic
    from autotune.model.sources import build_model
    from autotune.records.best import BestJson

    path = Path(best_path or os.environ.get("AUTOTUNE_BEST") or "best.json")
    if not path.is_file():  # as open() says it, not as a best.json that does not read
        raise FileNotFoundError(f"no best.json at {path}")
    best = BestJson.read(path)
    job = best.job
    if not best.meets_drift or not job:
        raise ValueError(f"{path} holds no timed winner (no configuration met the drift bound)")
    if check_environment:
        differences = environment_differences(best)
        if differences:
            raise TunedEnvironmentMismatch(
                f"this process was not started as tuned ({'; '.join(differences)}): start it with the script from "
                f"'autotune export --format sh', e.g. ./launch.sh python your_program.py"
            )
    config = best.config
    source = job.model
    if job.generation:
        return _load_generator(
            job.generation, config, model if model is not None else build_model(source), job.artifact_dir
        )
    example = synthetic(source.specs, config.batch_size, 0)
    module = backend_module(config.backend)
    if BACKENDS[config.backend].builds_artifact(config.precision):
        runner = module.load(example, config, Path(str(job.artifact_dir)))
    else:
        runner = module.prepare(
            model if model is not None else build_model(source), example, config, Path(str(job.workdir))
        )

    import numpy as np
    import torch

    takes_numpy = runner.takes == "numpy"

    def native(value: Any) -> Any:
        """The caller's tensor or array, in the kind the backend runs on, converted only when the kinds differ:
        a numpy array goes to ONNX Runtime or OpenVINO as it is and to a torch backend as a zero-copy view; a
        tensor goes to a torch backend as it is (to ONNX Runtime or OpenVINO as a view, in convert_input).
        Anything else is refused in one line."""
        if isinstance(value, np.ndarray):
            return value if takes_numpy else torch.from_numpy(value)
        if isinstance(value, torch.Tensor):
            return value
        raise TypeError(
            f"the tuned model takes torch tensors or numpy arrays (a batch of {config.batch_size}), "
            f"got {type(value).__name__}"
        )

    def infer(*inputs: Any) -> Any:
        batch = tuple(native(x) for x in as_batch(inputs[0] if len(inputs) == 1 else inputs))
        return runner(runner.convert_input(batch))

    infer.config = config  # type: ignore[attr-defined]
    infer.runner = runner  # type: ignore[attr-defined]  # the backend's Runner, for inspection
    return infer

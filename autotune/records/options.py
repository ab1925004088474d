"""The options of a search, written once: `SearchOptions` holds each option's name, type, default, help
and how the command line spells it. The CLI parser (cli.py), `autotune.search(model, **options)` and the
option table of the manual's command reference are made from it, so an option cannot exist in one and not
the others, nor differ in its default.

Validation that needs the model, the data or the machine happens where the options become the stored
SearchSpec (api.search_spec); what a value alone can say is checked here, one line naming the option.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.common.errors import UserError
from autotune.common.sizes import DEFAULT_CACHE_SIZE, DEFAULT_TRIAL_MEMORY
from autotune.measure.drift import (
    DEFAULT_CLASSIFY_METRIC,
    DEFAULT_GENERATION_METRIC,
    DEFAULT_MAX_DRIFT,
    METRIC_HELP,
    METRICS,
    RELATIVE_METRICS,
)
from autotune.model.generation import DEFAULT_DRIFT_PROMPTS, DEFAULT_NEW_TOKENS, DEFAULT_PROMPT_TOKENS

DEFAULT_SPACE = Path(__file__).resolve().parent.parent.parent / "search_spaces" / "default.yaml"
GENERATION_SPACE = DEFAULT_SPACE.with_name("generate.yaml")
SERVING_SPACE = DEFAULT_SPACE.with_name("generate-server.yaml")  # a language model's server scenario
# The finalist round's defaults, shared by the CLI, the Python API, a joining worker and the replay
# benchmark (which replays the round's choice of contenders).
DEFAULT_EVAL_SAMPLES = 32  # a classifier's evaluation set when --eval-samples does not say
DEFAULT_FINALISTS = 3  # top configs re-measured at the end, interleaved (0: none)
DEFAULT_FINALIST_REPEATS = 3  # runs of each
DEFAULT_FINALIST_SHARE = 0.2  # of the budget, kept for them

Duration = str | float  # "90s", "20m", "2h", "1h30m", or seconds
PathArg = str | os.PathLike[str]
TASKS = ("auto", "classify", "generate")
GENERATION_GROUP = "text generation (a factory returning a causal language model, e.g. a transformers *ForCausalLM)"


def count_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (argparse turns the error into one line and exit 2)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"give counts separated by commas, e.g. 1,2,4 (got {text!r})") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"counts must be 1 or more (got {text!r})")
    return values


@dataclass(frozen=True)
class Flag:
    """How the command line spells one option. A bool option whose default is True is given as
    `--no-<name>` (it turns the option off); one whose default is False as `--<name>`."""

    help: str
    doc: str = ""  # the manual's longer text (markdown); the help when empty
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None  # the command line's words -> the value (int, float, ...)
    repeat: bool = False  # given once per value (--runtime A --runtime B)
    group: str | None = None
    show_default: bool = True

    def text(self) -> str:
        return self.doc or self.help


def option(default: Any = dataclasses.MISSING, **flag: Any) -> Any:
    """A SearchOptions field: its default, and its Flag in the field's metadata."""
    if default is dataclasses.MISSING:
        return field(metadata={"flag": Flag(**flag)})
    return field(default=default, metadata={"flag": Flag(**flag)})


@dataclass(frozen=True)
class SearchOptions:
    """Every option of `autotune search` / `autotune.search(...)`, by the same names and defaults."""

    model: Any = option(
        help="torchvision classification model name, a Hugging Face model folder, file.py:function / "
        "module:function returning an nn.Module, or a TorchScript (.pt) or exported program (.pt2) file",
        doc="a torchvision classification model name (`autotune models`), a Hugging Face model folder "
        "(`config.json` and `model.safetensors`, sharded or not, or `pytorch_model.bin`, loaded weights-only: a "
        "`…ForCausalLM` generates text, a `…ForImageClassification` classifies), `path/to/file.py:function` / "
        "`package.module:function` returning an `nn.Module` (or `(model, example_inputs)`: the inputs' shapes, "
        "dtypes and integer ranges are then read from the batched example, a tensor, tuple or dict of tensors), "
        "a TorchScript file (`.pt`, `.ts`: `torch.jit.save`) or an exported program (`.pt2`: `torch.export.save`, "
        "with a dynamic batch dimension; its input shape is read from it; its loader may unpickle Python "
        "objects, so it needs `--allow-pickle`). Model files hold their weights. From Python, also the factory "
        "function itself",
    )
    weights: PathArg | None = option(
        None,
        metavar="FILE",
        help="state_dict file (torch.save, loaded with weights_only, or .safetensors)",
        doc="a `state_dict` file: `torch.save`'s, loaded with `weights_only=True`, or a `.safetensors` file. "
        "With a Hugging Face folder it replaces the folder's weights. Without it the pretrained weights are used if "
        "they are already in the local torch hub cache (`$TORCH_HOME/hub/checkpoints`), otherwise the model is "
        "**randomly initialised**; the first line printed says which",
    )
    allow_pickle: bool = option(
        False,
        help="load an exported program (.pt2) although its loader may unpickle Python objects (trusted files only)",
        doc="load a `.pt2` exported program although `torch.export.load` may unpickle Python objects from it "
        "(which can run code): for files you trust",
    )
    trust_remote_code: bool = option(
        False,
        help="let a Hugging Face model folder run the Python code it ships (its config's auto_map; trusted only)",
        doc="let a Hugging Face model folder run the Python code it ships (named by its config's `auto_map`), as "
        "transformers' `trust_remote_code=True` does: for folders you trust. Without it such a folder is refused",
    )
    input_shape: str | Sequence[int] | None = option(
        None,
        aliases=("--inputs",),
        help="one sample's shape, e.g. 3x224x224 (default: the model's); several or integer inputs as "
        "name:dtype:shape[:low-high],..., e.g. input_ids:int64:128:0-30522,attention_mask:int64:128:1-2",
        doc="one sample's shape, e.g. `3x224x224` (default: the model's own; from Python also a tuple); several "
        "or integer inputs as `name:dtype:shape[:low-high]`, comma-separated, passed to the model positionally in "
        "that order: `--inputs input_ids:int64:128:0-30522,attention_mask:int64:128:1-2` (dtypes `float32`, "
        "`int64`, `int32`; synthetic integers are drawn from `[low, high)`)",
    )
    budget: Duration = option("20m", help="wall-clock budget for this run: 90s, 20m, 2h, 1h30m (or seconds)")
    trials: int | None = option(None, parse=int, help="stop after this many trials in this run")
    study: str | None = option(None, help="study name (default: the model name)")
    storage: str | None = option(
        None,
        help="Optuna storage URL, e.g. postgresql://user@host/db (default: $AUTOTUNE_STORAGE, else "
        "sqlite:///<studies-dir>/<study>/study.db); a password is best kept in $AUTOTUNE_STORAGE",
    )
    space: PathArg | None = option(
        None,
        help=f"search space YAML (default {DEFAULT_SPACE.relative_to(DEFAULT_SPACE.parent.parent)}; "
        f"{GENERATION_SPACE.relative_to(GENERATION_SPACE.parent.parent)} for text generation, "
        f"{SERVING_SPACE.relative_to(SERVING_SPACE.parent.parent)} for its server scenario)",
    )
    objective: str = option(
        "throughput",
        choices=("throughput", "latency", "pareto"),
        help="maximize samples/s; minimize median latency per call; or pareto: samples/s up and p99 latency "
        "down together (a multi-objective study; best.json lists the Pareto front)",
        doc="`throughput` (samples/s summed over instances, maximised), `latency` (median latency per call — one "
        "batch, or one batch per stream for multi-stream OpenVINO — minimised), or `pareto`: throughput and p99 "
        "latency per call together, an Optuna multi-objective study. With `pareto` every measurement takes at "
        "least 100 calls, drift still prunes, there is no speed pruning or finalist round (no single value to "
        "compare), and `best.json` lists the whole Pareto front (`pareto_front`: trial, samples/s, p99, config), "
        "fastest first; its winner is the fastest point of the front",
    )
    scenario: str | None = option(
        None,
        choices=("offline", "server", "single-stream"),
        help="what is measured (MLPerf Inference's names): offline, full batches back to back (samples/s, the "
        "default, as --objective throughput); server, the highest Poisson request rate whose p99 latency from "
        "arrival to answer stays within --slo-ms, with dynamic batching searched (max_batch, max_wait_ms); "
        "single-stream, one request at a time (median latency, as --objective latency)",
        doc="what is measured, by MLPerf Inference's names: `offline` (full batches back to back, samples/s: the "
        "default, `--objective throughput`), `server` (the highest Poisson request rate whose p99 latency from "
        "arrival to answer stays within `--slo-ms`, with dynamic batching searched: see [Serving under "
        "load](../serving.md#serving-under-load-the-server-scenario)), `single-stream` (one request at a time, "
        "median latency: "
        "`--objective latency`). `--objective` keeps working; the two must not disagree",
    )
    slo_ms: float | None = option(
        None,
        parse=float,
        metavar="MS",
        help="latency SLO: the highest throughput whose p99 latency per call stays under MS milliseconds "
        "(slower configs are measured, then pruned; every measurement takes at least 100 calls); with "
        "--scenario server, the bound on each request's p99 latency, queueing included",
        doc="a latency SLO: the highest throughput whose p99 latency per call (one batch; one batch per stream for "
        "multi-stream OpenVINO) stays under MS milliseconds. Every measurement then takes at least 100 calls; a "
        "config over the bound is measured, recorded with its p99 (`slo`), and PRUNED, so it never wins. With "
        "`--scenario server`, the bound on each request's p99 latency from arrival to answer, queueing included",
    )
    task: str = option(
        "auto",
        choices=TASKS,
        group=GENERATION_GROUP,
        help="generate: time text generation (TTFT, TPOT, generated tokens/s); classify: one forward pass; "
        "auto: generate when the factory returns a causal language model",
    )
    prompt_tokens: int = option(
        DEFAULT_PROMPT_TOKENS, parse=int, metavar="N", group=GENERATION_GROUP, help="prompt length in tokens"
    )
    new_tokens: int = option(
        DEFAULT_NEW_TOKENS, parse=int, metavar="N", group=GENERATION_GROUP, help="tokens generated per sequence"
    )
    sequences: Sequence[int] | None = option(
        None,
        parse=count_list,
        metavar="1,2,4",
        group=GENERATION_GROUP,
        help="total concurrent sequences to search, split evenly across instances (default: the space's)",
    )
    ttft_slo_ms: float | None = option(
        None, parse=float, metavar="MS", group=GENERATION_GROUP, help="p99 bound on time to first token"
    )
    tpot_slo_ms: float | None = option(
        None, parse=float, metavar="MS", group=GENERATION_GROUP, help="p99 bound on time per output token"
    )
    max_drift: str | float = option(
        str(DEFAULT_MAX_DRIFT),
        help="largest drop from FP32 on --drift-metric: a number (absolute) or, for "
        f"{' and '.join(RELATIVE_METRICS)}, a percentage of FP32's value, e.g. 1%",
        doc="the largest drop: a number is absolute (`0.05`, default; `--max-drift 0.01` with accuracy is one "
        f"point); for {' and '.join(f'`{m}`' for m in RELATIVE_METRICS)} it may be a percentage, relative to FP32's "
        "value (`--drift-metric accuracy --max-drift 1%`: keep 99% of FP32's accuracy; `--drift-metric perplexity "
        "--max-drift 2%`: a perplexity at most 2% above FP32's)",
    )
    # Both texts list every metric of the code's own list, so neither can leave one out.
    drift_metric: str | None = option(
        None,
        choices=METRICS,
        help=f"what --max-drift bounds (default: {DEFAULT_GENERATION_METRIC} for a language model, "
        f"{DEFAULT_CLASSIFY_METRIC} for a classifier): " + "; ".join(f"{m}: {METRIC_HELP[m]}" for m in METRICS),
        doc="what `--max-drift` bounds, as a drop from FP32 eager (default: "
        f"`{DEFAULT_GENERATION_METRIC}` for a language model, as llama.cpp's tables rank quantization types; "
        f"`{DEFAULT_CLASSIFY_METRIC}` for a classifier): " + "; ".join(f"`{m}`: {METRIC_HELP[m]}" for m in METRICS),
    )
    data: PathArg | None = option(
        None,
        metavar="PATH",
        help="drift (and calibration) data: an image folder (one subfolder per class gives labels) or a "
        "tensor file ({'inputs', 'labels'} or a tensor); for a language model, a text file (encoded by the model "
        "folder's tokenizer; without one, its UTF-8 bytes are the token ids) or a tensor file of token ids: the "
        "prompts and the text drift and perplexity are "
        "measured on; default: synthetic inputs",
        doc="what drift is measured on, and int8 calibrated on: an image folder (ImageFolder layout: one subfolder "
        "per class gives labels; a flat folder has none), preprocessed as the model expects (a torchvision model's "
        "own weights transforms, else resize + ImageNet normalisation to `--input-shape`), or a tensor file saved "
        'with `torch.save`: a tensor of inputs, or `{"inputs": …, "labels": …}` where inputs is a tensor, or a '
        "tuple or dict of tensors for a model with several inputs. For a language model (text generation), a "
        "text file, any file but `.pt`/`.pth`, encoded by the tokenizer of the model's Hugging Face folder (the "
        "ids the model sees in use); a factory's model, or a folder without a tokenizer, reads it as its UTF-8 "
        "bytes, each byte one token id (folded into the vocabulary: a fixed, tokenizer-free mapping, the same for "
        "every candidate, so perplexity is that of bytes, text the model never sees), or a `.pt`/`.pth` file of "
        "token ids (`torch.save` of a 1-D or 2-D integer tensor, each id within the vocabulary): seeded windows "
        "of it are the timed prompts, the text drift and perplexity are measured on, and SmoothQuant's "
        "calibration text (a file shorter than a prompt is repeated). Without it, seeded "
        "synthetic inputs (random token ids for a language model), with a warning: drift then says little about "
        "accuracy",
    )
    calibration_data: PathArg | None = option(
        None, metavar="PATH", help="calibrate int8 on this image folder or tensor file instead of a split of --data"
    )
    eval_samples: int | None = option(
        None,
        parse=int,
        metavar="N",
        help=f"inputs drift is measured on: a classifier's evaluation set, drawn first from one seeded shuffle of "
        f"--data (default {DEFAULT_EVAL_SAMPLES}); a language model's prompts, windows of --data (default "
        f"{DEFAULT_DRIFT_PROMPTS}; more narrow the KL divergence's sampling error, each trial evaluating them all)",
        doc=f"what drift is measured on: a classifier's evaluation set, drawn first from one seeded shuffle of "
        f"`--data` (default {DEFAULT_EVAL_SAMPLES}); a language model's prompts, seeded windows of `--data` (default "
        f"{DEFAULT_DRIFT_PROMPTS}, each compared on its last 128 positions and every decode step; more narrow the "
        "KL divergence's sampling error, and every trial evaluates them all)",
    )
    calibration_samples: int = option(
        64,
        parse=int,
        metavar="N",
        help="inputs int8 quantization is calibrated on, drawn after the evaluation set (disjoint from it)",
        doc="size of the calibration set int8 is calibrated on, drawn after the evaluation set from the same "
        "shuffle, so the two are disjoint",
    )
    trial_timeout: Duration = option("10m", help="a trial running longer is killed and recorded as FAIL")
    measure_seconds: Duration = option(
        "5s",
        metavar="MIN[-MAX]",
        help="measurement window per trial: at least MIN, growing while the median is not known to ±2% (95% "
        "confidence), up to MAX (default 4x MIN, at least MIN+10s; 0.3s-2s for a quick look)",
    )
    speed_pruning: bool = option(
        True, help="measure every trial fully (no screening window, no pruning of clearly slower configs)"
    )
    cover_backends: bool = option(True, help="do not start a new study with one trial per backend x precision")
    finalists: int = option(
        DEFAULT_FINALISTS, parse=int, metavar="N", help="top configs re-measured at the end, interleaved (0: none)"
    )
    finalist_repeats: int = option(DEFAULT_FINALIST_REPEATS, parse=int, metavar="N", help="runs of each finalist")
    finalist_share: float = option(
        DEFAULT_FINALIST_SHARE, parse=float, metavar="F", help="fraction of the budget kept for the finalists"
    )
    memory_limit: str = option(
        DEFAULT_TRIAL_MEMORY,
        metavar="SIZE",
        help="a trial whose processes together hold more resident memory is killed and recorded as FAIL: 8G, "
        "800M, or a share of this machine's memory",
    )
    cache_size: str = option(
        DEFAULT_CACHE_SIZE,
        metavar="SIZE",
        help="cap of the artifact cache shared by the studies under --studies-dir; past it the least recently "
        "used artifacts are evicted",
    )
    runtimes: Sequence[PathArg] = option(
        (),
        aliases=("--runtime",),
        repeat=True,
        metavar="PATH",
        show_default=False,
        help="another Python environment (virtual environment folder or its python) trials may run in, "
        "e.g. another torch version; repeatable. The main one and .venv-ipex are always used",
        doc="another Python environment (a virtual environment folder or its `python`) trials may run in, e.g. "
        "one with another torch version; repeatable (from Python: `runtimes=[...]`). Its trials compete with the "
        "main runtime's for every backend it imports (see "
        "[Runtimes](../tuning.md#runtimes-ipex-in-its-own-environment))",
    )
    heartbeat_grace: Duration = option(
        "60s",
        help="a trial whose worker sent no heartbeat this long is failed and queued again (each running trial "
        "beats every quarter of it)",
    )
    studies_dir: PathArg = option("studies", help="where study folders live")

    @classmethod
    def from_keywords(cls, model: Any, options: dict[str, Any]) -> SearchOptions:
        """`autotune.search(model, **options)`'s keywords; an unknown one is one line listing the known."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise UserError(
                f"autotune.search got an unknown option {unknown[0]!r}; its options are {', '.join(known[1:])}"
            )
        return cls(model=model, **options)

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> SearchOptions:
        """The parsed command line (made by `add_arguments`) as options."""
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
        return cls(**{**values, "runtimes": tuple(values["runtimes"] or ())})


OPTION_FIELDS = {f.name: f for f in dataclasses.fields(SearchOptions)}


def flag_of(name: str) -> Flag:
    flag: Flag = OPTION_FIELDS[name].metadata["flag"]
    return flag


def flag_names(name: str) -> list[str]:
    """How the command line spells an option: --no-speed-pruning, --input-shape/--inputs, --runtime."""
    flag, default = flag_of(name), OPTION_FIELDS[name].default
    if default is True:
        return [f"--no-{name.replace('_', '-')}"]
    spelled = [f"--{name.replace('_', '-')}", *flag.aliases]
    return spelled[1:] if flag.repeat else spelled


def flag(name: str) -> str:
    """The option as a message names it: --max-drift, --no-speed-pruning, --runtime."""
    return flag_names(name)[0]


def default_of(name: str) -> Any:
    """The option's default, as SearchOptions holds it (a duration as given: "20m")."""
    return OPTION_FIELDS[name].default


def default_seconds(name: str) -> float:
    """A duration option's default in seconds: budget "20m" -> 1200.0."""
    from autotune.common.durations import parse_duration

    return parse_duration(str(default_of(name)))


def default_text(name: str) -> str | None:
    """The default as the command line would give it, or None when there is none to show."""
    default = OPTION_FIELDS[name].default
    if not flag_of(name).show_default or default in (None, True, False, dataclasses.MISSING):
        return None
    return str(default)


def add_arguments(
    parser: argparse.ArgumentParser,
    names: Sequence[str] | None = None,
    required: Sequence[str] = (),
    overrides: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Add the options `names` (default: all) to `parser` as the command line spells them; `required`
    ones must be given; `overrides` changes a keyword of one option's add_argument (another command's
    own help or default, e.g. `autotune join --finalists`)."""
    groups: dict[str, Any] = {}
    for name in names or list(OPTION_FIELDS):
        flag, default = flag_of(name), OPTION_FIELDS[name].default
        shown = default_text(name)
        kwargs: dict[str, Any] = {
            "dest": name,
            "help": (flag.help + (f" (default {shown})" if shown else "")).replace("%", "%%"),
        }
        if isinstance(default, bool):
            kwargs.update(action="store_false" if default else "store_true", default=default)
        else:
            kwargs.update(
                default=None if flag.repeat or default is dataclasses.MISSING else default,
                type=flag.parse,
                metavar=flag.metavar,
                choices=flag.choices,
                action="append" if flag.repeat else "store",
            )
            if flag.parse is None:
                del kwargs["type"]
        kwargs["required"] = name in required or default is dataclasses.MISSING
        kwargs.update((overrides or {}).get(name, {}))
        target = parser
        if flag.group:
            target = groups.setdefault(flag.group, parser.add_argument_group(flag.group))
        target.add_argument(*flag_names(name), **kwargs)


def options_table() -> str:
    """The table of `autotune search`'s options, made from SearchOptions: the manual's command reference
    puts it in when the site is built (autotune/cli_reference.py); `python -m autotune.records.options`
    prints it."""
    lines = ["| option | what it does | default |", "|---|---|---|"]
    for name in OPTION_FIELDS:
        metavar = flag_of(name).metavar
        spelled = ", ".join(f"`{n}{' ' + metavar if metavar else ''}`" for n in flag_names(name))
        shown = default_text(name)
        text = flag_of(name).text().replace("|", "\\|")
        lines.append(f"| {spelled} | {text} | {f'`{shown}`' if shown else ''} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(options_table())

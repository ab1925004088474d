"""Command line: parse words, call one function. Bad input: one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console

from autotune.common.errors import UserError
from autotune.measure.noise import NoiseLimits
from autotune.records.options import SearchOptions, add_arguments, default_text

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

if TYPE_CHECKING:
    from autotune.api import Result


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors: one line, exit 2
        raise UserError(f"{message} (see '{self.prog} --help')")


def _given_storage(args: argparse.Namespace) -> str | None:
    """--storage, else $AUTOTUNE_STORAGE (keeps a password out of the process list); None: the study's SQLite file."""
    return args.storage or os.environ.get("AUTOTUNE_STORAGE")


def _storage_arg(args: argparse.Namespace, study: str | None = None) -> str:
    from autotune.records.spec import default_storage

    return _given_storage(args) or default_storage(args.studies_dir, study or args.study)


def _heartbeat_grace(args: argparse.Namespace) -> float:
    from autotune.api import heartbeat_grace_s

    return heartbeat_grace_s(args.heartbeat_grace)


def search_summary(result: Result) -> str:
    """The last line of `autotune search`: the winner and where best.json went, or why there is none."""
    best = result.best
    if best is None:
        return "no trial completed: nothing to export"
    if not best.meets_drift:
        return f"no trial met the drift bound: {best.selection}; wrote {result.best_path} (meets_drift: false)"
    alike = "interleaved" in (best.speedup_source or "")
    how = "re-measured alike" if alike else "from their search measurements"
    speed = f", {best.speedup_vs_baseline:.2f}x the eager fp32 baseline ({how})" if best.speedup_vs_baseline else ""
    revalidated = best.objective.revalidated_median
    unit = best.throughput_unit
    server, served = best.server, best.llm_server
    if served:  # a language model's server: the sustained rate within the TTFT and TPOT bounds, its sequences
        rate = revalidated or served.sustained_rps
        found = f" (re-measured; its search measurement: {served.sustained_rps:.2f})" if revalidated else ""
        load = (
            f" (goodput {served.goodput_rps:.2f}, {served.in_flight:.1f} requests in flight on average)"
            if served.goodput_rps is not None and served.in_flight is not None
            else ""
        )
        number = (
            f"{rate:.2f} requests/s sustained within {served.bounds.describe()}{load}, {served.concurrency} "
            f"sequences at once{found}"
        )
    elif server:  # the server scenario: a sustained request rate at the bound, and the batching that did it
        bound = f"p99 <= {server.slo_ms:g} ms, max_batch {server.max_batch}, max_wait {server.max_wait_ms:g} ms"
        rate = revalidated or server.sustained_rps
        number = f"{rate:.1f} requests/s sustained at {bound}{' (re-measured)' if revalidated else ''}"
    elif revalidated:  # the re-validated number first; the search's single measurement labelled as such
        number = f"{revalidated:.1f} {unit} re-measured (its search measurement: {best.throughput_sps:.1f})"
    else:
        number = f"{best.throughput_sps:.1f} {unit} from one search measurement"
    return f"best: trial {best.study.trial} {number}{speed}; {best.selection}; wrote {result.best_path}"


def cmd_search(args: argparse.Namespace, console: Console) -> int:
    from autotune.api import search

    result = search(console=console, **dataclasses.asdict(SearchOptions.from_arguments(args)))
    print_study(result.study, console, top=5)
    console.print(search_summary(result), markup=False)
    return EXIT_INTERRUPTED if result.interrupted else 0


def _load_study(args: argparse.Namespace):
    import optuna

    from autotune.common.storage_urls import mask_url
    from autotune.records.spec import default_storage
    from autotune.tuning.storage import open_storage

    if not _given_storage(args):
        database = default_storage(args.studies_dir, args.study).removeprefix("sqlite:///")
        if not Path(database).is_file():
            raise UserError(
                f"no study {args.study!r} under {args.studies_dir}/: check --study, --studies-dir or --storage"
            )
    storage = open_storage(_storage_arg(args))
    try:
        return optuna.load_study(study_name=args.study, storage=storage)
    except KeyError:
        raise UserError(
            f"no study {args.study!r} in {mask_url(_storage_arg(args))}: check --study and --storage"
        ) from None


def print_study(study, console: Console, top: int) -> None:
    """The study's summary, the winner as re-validated, its leaderboard, and its failures and prunings
    grouped by cause."""
    from autotune.results.budget_breakdown import budget_line
    from autotune.results.leaderboard import (
        leaderboard_rows,
        leaderboard_table,
        outcome_table,
        study_summary,
        winner_lines,
    )

    console.print(study_summary(study), markup=False)
    spent = budget_line(study)
    if spent:
        console.print(spent, markup=False)
    for line in winner_lines(study):
        console.print(line, markup=False)
    rows = leaderboard_rows(study, top)
    if rows:
        console.print(leaderboard_table(study, top, rows))
    outcomes = outcome_table(study)
    if outcomes is not None:
        console.print(outcomes)


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from autotune.records.spec import study_dir
    from autotune.results.optuna_artifacts import attach_to_study
    from autotune.results.report import write_report

    study = _load_study(args)
    folder = study_dir(args.studies_dir, args.study)
    path = write_report(study, Path(args.output) if args.output else folder / "report.html")
    attach_to_study(study, folder, path, "text/html")
    console.print(f"wrote {path} (self-contained: open it in any browser, no network needed)", markup=False)
    return 0


def cmd_show(args: argparse.Namespace, console: Console) -> int:
    print_study(_load_study(args), console, args.top)
    return 0


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    from autotune.records.spec import study_dir
    from autotune.results.best_json import export_best

    study = _load_study(args)
    folder = study_dir(args.studies_dir, args.study)
    if args.format == "json":
        path = export_best(study, args.output or folder / "best.json")
        console.print(f"wrote {path}", markup=False)
        return 0
    if args.format in ("llama-server", "openvino-genai"):
        return _export_engine(study, args, folder, console)
    from autotune.common.files import write_text_atomic
    from autotune.records.best import BestJson
    from autotune.results.launch_script import launch_script
    from autotune.results.optuna_artifacts import attach_to_study

    best_path = export_best(study, folder / "best.json")
    best = BestJson.read(best_path)
    attach_to_study(study, folder, best_path, "application/json")
    if not best.meets_drift or best.launch is None or not best.launch.pin_prefixes:
        raise UserError(f"study {args.study!r} has no timed winner to launch (best.json says why: {best_path})")
    script = write_text_atomic(args.output or folder / "launch.sh", launch_script(best, best_path), mode=0o755)
    console.print(
        f"wrote {script} (runs your command as tuned: {script} python serve.py) and {best_path}", markup=False
    )
    return 0


def _export_engine(study, args: argparse.Namespace, folder: Path, console: Console) -> int:
    """best.json, and beside it the best trial of one engine as that engine deploys it."""
    from autotune.records.best import BestJson
    from autotune.records.spec import StoredSpec
    from autotune.results.best_json import export_best
    from autotune.results.engine_export import export_llama_server, export_openvino_genai

    if StoredSpec.of(study).task != "generate":
        raise UserError(f"--format {args.format} exports a language model; study {args.study!r} is a classifier")
    best = BestJson.read(export_best(study, folder / "best.json"))
    total = best.config.total_batch if best.meets_drift and best.config else None
    target = Path(args.output) if args.output else folder
    export = export_llama_server if args.format == "llama-server" else export_openvino_genai
    written = export(study, target, total)
    console.print(
        f"wrote {', '.join(str(p) for p in written)} (the script's first lines say what it runs)", markup=False
    )
    return 0


def cmd_dashboard(args: argparse.Namespace, console: Console) -> int:
    from autotune.records.spec import study_dir
    from autotune.results.dashboard import serve
    from autotune.results.optuna_artifacts import artifact_folder

    _load_study(args)
    return serve(
        _storage_arg(args), args.host, args.port, console, artifact_folder(study_dir(args.studies_dir, args.study))
    )


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    from autotune.records.spec import study_dir
    from autotune.remeasure.bench import compare_with_baseline

    if not (args.best or args.study):
        raise UserError("compare needs --study NAME or --best FILE")
    path = Path(args.best) if args.best else study_dir(args.studies_dir, args.study) / "best.json"
    if not path.is_file():
        raise UserError(f"{path} does not exist: run 'autotune search' (or 'autotune export') first")
    from autotune.common.durations import parse_duration
    from autotune.records.job import WorkerJob
    from autotune.results.best_json import read_best

    stored = read_best(path).job  # one line, exit 2, for a file that is not a timed best.json
    job = WorkerJob.from_json(stored) if stored else None
    generation, server = (bool(job.generation), bool(job.server)) if job else (False, False)
    asked = args.independent not in (None, "0") or args.vs_benchmark_app
    if generation and asked:
        raise UserError("--independent and --vs-benchmark-app time one forward pass: not a text generation winner")
    if server and asked:
        raise UserError(
            "--independent and --vs-benchmark-app time closed-loop calls: not a sustained rate; for OpenVINO's "
            "throughput mode under the same arrivals see docs/benchmarks/server_scenario.py"
        )
    chosen = args.independent if args.independent is not None else ("0" if generation or server else "20s")
    independent = parse_duration(chosen) if chosen != "0" else 0.0
    versus = parse_duration(args.vs_benchmark_app) if args.vs_benchmark_app else 0.0
    compare_with_baseline(path, args.repeats, console, independent, versus)
    return 0


def cmd_join(args: argparse.Namespace, console: Console) -> int:
    if args.alias == "worker":
        console.print("note: 'autotune worker' is now 'autotune join'; the old name still works", markup=False)
    from autotune.common.durations import parse_duration
    from autotune.tuning.fleet_join import joining_spec
    from autotune.tuning.study import run_search

    spec = joining_spec(
        args.study,
        _storage_arg(args),
        Path(args.studies_dir),
        parse_duration(args.budget),
        args.trials,
        args.allow_mixed_hardware,
        _heartbeat_grace(args),
        args.finalists,
    )
    if spec.mixed_hardware:
        console.print(
            f"warning: joining from a different machine ({'; '.join(spec.mixed_hardware)}); recorded in each trial",
            markup=False,
        )
    outcome = run_search(spec, console)
    print_study(outcome.study, console, top=5)
    return EXIT_INTERRUPTED if outcome.interrupted else 0


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from autotune.remeasure.verify import verify

    if args.repeats < 1:
        raise UserError(f"--repeats must be at least 1, got {args.repeats}")
    return verify(Path(args.best), args.repeats, console, through_load=args.through_load)


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    from autotune.api import measure_settings
    from autotune.common.durations import parse_duration
    from autotune.model.sources import resolve_model
    from autotune.remeasure.bench import benchmark_backends

    model = resolve_model(args.model, args.weights, args.input_shape)
    window = parse_duration(args.measure_seconds)
    measure = measure_settings(window, min_iterations=args.min_iterations, cap_s=300.0)
    benchmark_backends(
        model, args.batch_size, args.repeats, measure, Path(args.studies_dir).resolve(), console, args.only
    )
    return 0


def cmd_probe(args: argparse.Namespace, console: Console) -> int:
    from autotune.machine.probe import probe_machine
    from autotune.machine.probe_report import ProbeReport
    from autotune.machine.runtimes import discover_runtimes
    from autotune.records.config import clean_environment

    machine, runtimes = probe_machine(), discover_runtimes(args.runtime or ())
    report = ProbeReport.of(machine, runtimes, clean_environment(dict(os.environ)))
    print(json.dumps(report.to_json(), indent=2) if args.json else "\n".join(report.lines()))
    return 0


def cmd_models(args: argparse.Namespace, console: Console) -> int:
    from autotune.model.sources import torchvision_classification_models

    print("\n".join(torchvision_classification_models()))
    return 0


def _add_study_args(parser: argparse.ArgumentParser, required: bool) -> None:
    add_arguments(parser, ("study", "storage", "studies_dir"), required=("study",) if required else ())


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="autotune", description="Find the fastest way to run a PyTorch model on this CPU, and prove it."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    _add_study_commands(sub)
    _add_remeasure_commands(sub)
    _add_machine_commands(sub)
    return parser


def _add_study_commands(sub: Any) -> None:
    """The commands that run a study or read one: search, join, export, dashboard, report, show."""
    search = sub.add_parser("search", help="run (or resume) a study")
    add_arguments(search)
    search.set_defaults(func=cmd_search)

    for name in ("join", "worker"):  # `worker`: the command's name before `join`, kept for scripts that use it
        join = sub.add_parser(
            name,
            help="join an existing study from this machine, with the settings stored in it"
            + ("" if name == "join" else " (the old name of 'autotune join')"),
        )
        _add_study_args(join, required=True)
        add_arguments(
            join,
            ("budget", "trials", "finalists", "heartbeat_grace"),
            overrides={
                "budget": {"help": f"this worker's wall-clock budget (default {default_text('budget')})"},
                "finalists": {
                    "default": None,
                    "help": "top configs this worker re-measures at its end (default: the study's; 0 leaves it to "
                    "another worker)",
                },
            },
        )
        join.add_argument(
            "--allow-mixed-hardware",
            action="store_true",
            help="join although this machine's hardware or software differs from the study's (recorded in each trial)",
        )
        join.set_defaults(func=cmd_join, alias=name)

    export = sub.add_parser("export", help="write best.json from a stored study")
    _add_study_args(export, required=True)
    export.add_argument(
        "-o",
        "--output",
        help="output path (default studies/<study>/best.json, or launch.sh with --format sh; a folder for "
        "llama-server and openvino-genai, default the study's)",
    )
    export.add_argument(
        "--format",
        choices=("json", "sh", "llama-server", "openvino-genai"),
        default="json",
        help="json: best.json; sh: a launch script that starts your command pinned with the tuned environment; "
        "llama-server: the study's best llama.cpp trial as its GGUF and the llama-server command with its tuned "
        "threads, batch, ubatch, flash attention, KV cache, pinning and environment; openvino-genai: the best "
        "OpenVINO trial as its IR folder (with the tokenizer), its LLMPipeline settings and a runner",
    )
    export.set_defaults(func=cmd_export)

    dash = sub.add_parser("dashboard", help="serve the study in optuna-dashboard")
    _add_study_args(dash, required=True)
    dash.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    dash.add_argument("--port", type=int, default=8080, help="port to serve on (default 8080)")
    dash.set_defaults(func=cmd_dashboard)

    report = sub.add_parser(
        "report", help="write a self-contained HTML report of a study (charts, leaderboard, failures)"
    )
    _add_study_args(report, required=True)
    report.add_argument("-o", "--output", help="output path (default studies/<study>/report.html)")
    report.set_defaults(func=cmd_report)

    show = sub.add_parser("show", help="a study's leaderboard, and its failures grouped by cause")
    _add_study_args(show, required=True)
    show.add_argument("--top", type=int, default=10, help="configurations in the leaderboard (default 10)")
    show.set_defaults(func=cmd_show)


def _add_remeasure_commands(sub: Any) -> None:
    """The commands that re-measure outside a search: compare, bench, verify."""
    compare = sub.add_parser("compare", help="re-measure the winner against the eager fp32 baseline, alternating")
    compare.add_argument("--study", help="study whose studies/<study>/best.json to use")
    compare.add_argument("--best", help="a best.json file (instead of --study)")
    compare.add_argument(
        "--studies-dir", default="studies", help="where study folders live, for --study (default studies)"
    )
    compare.add_argument("--repeats", type=int, default=3, help="runs of each config (default 3)")
    compare.add_argument(
        "--independent",
        default=None,
        help="also time the winner with an independent stopwatch for this long per run: benchmark_app "
        "for an OpenVINO winner, a plain loop otherwise (default 20s, none for text generation; 0: skip)",
    )
    compare.add_argument(
        "--vs-benchmark-app",
        metavar="SECONDS",
        help="also run 'benchmark_app -hint throughput' on the NNCF int8 IR for this long per run",
    )
    compare.set_defaults(func=cmd_compare)

    bench = sub.add_parser("bench", help="every backend x precision side by side on one model (a benchmark table)")
    bench.add_argument(
        "--model",
        required=True,
        help="torchvision classification model name, file.py:function / module:function returning an nn.Module, "
        "or a TorchScript (.pt) file",
    )
    bench.add_argument(
        "--weights",
        help="state_dict file, loaded with weights_only (default: the pretrained weights if cached, else random init)",
    )
    bench.add_argument(
        "--input-shape",
        help="one sample's shape, e.g. 3x224x224 (default: the model's); several or integer inputs as "
        "name:dtype:shape[:low-high],..., as for search",
    )
    bench.add_argument("--batch-size", type=int, default=8, help="samples per call, for every config (default 8)")
    bench.add_argument("--repeats", type=int, default=1, help="interleaved runs of each config (default 1)")
    bench.add_argument("--measure-seconds", default="10s", help="minimum timed window per run (default 10s)")
    bench.add_argument(
        "--min-iterations", type=int, default=100, help="minimum calls per run: p99 needs 100 (default 100)"
    )
    bench.add_argument("--only", nargs="+", help="a subset of configs, e.g. 'openvino int8' 'torchao int8'")
    bench.add_argument(
        "--studies-dir",
        default="studies",
        help="the reference and each run's files go under <dir>/benchmarks, prepared artifacts under <dir>/.cache "
        "(default studies)",
    )
    bench.set_defaults(func=cmd_bench)

    verify = sub.add_parser(
        "verify", help="re-measure an exported best.json here; say whether the machine differs or it regressed"
    )
    verify.add_argument("best", help="a best.json file")
    verify.add_argument("--repeats", type=int, default=3, help="runs, in fresh processes (default 3)")
    verify.add_argument(
        "--through-load",
        action="store_true",
        help="after each run, time the winner as a program does: autotune.load() in processes started by the "
        "launch script, for the same window; prints the gap to the protocol's figure from the same runs",
    )
    verify.set_defaults(func=cmd_verify)


def _add_machine_commands(sub: Any) -> None:
    """What this machine offers: probe, models."""
    probe = sub.add_parser(
        "probe", help="print what this machine offers (cores, ISA, allocators, OpenMP, runtimes and their backends)"
    )
    probe.add_argument(
        "--runtime",
        action="append",
        metavar="PATH",
        help="also probe this runtime (a virtual environment or its python)",
    )
    probe.add_argument("--json", action="store_true", help="machine-readable output")
    probe.set_defaults(func=cmd_probe)
    models = sub.add_parser("models", help="list the torchvision classification models")
    models.set_defaults(func=cmd_models)


def main(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress lines reach a log file as they happen
    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    try:
        args = build_parser().parse_args(argv)
        NoiseLimits.from_environment()  # a bad AUTOTUNE_MAX_STEAL is refused before any work
        return args.func(args, console)
    except UserError as exc:
        print(f"autotune: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("autotune: interrupted; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

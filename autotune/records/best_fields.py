"""What each field of best.json means, written beside its record (records/best.py) and checked against it:
`undocumented()` names a field the record has and no description covers, `unknown()` a description of a
field the record lacks (tests/test_docs.py fails on either). The manual's best.json page is made from it
when the site is built (docs/hooks.py); `python -m autotune.records.best_fields` prints the table.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from autotune.records.best import BestJson


@dataclass(frozen=True)
class FieldDoc:
    """One row of the table: the dotted paths it describes (a record's fields, or keys of a free-form
    object below a field), and what they mean (Markdown)."""

    paths: tuple[str, ...]
    text: str


FIELDS: tuple[FieldDoc, ...] = (
    FieldDoc(
        ("schema",),
        '`"autotune.best/2"` (2: `selection`, `finalists`, `speedup_source`; `measurement.iterations` became `calls`)',
    ),
    FieldDoc(
        ("created",),
        "UTC time of writing (ISO 8601)",
    ),
    FieldDoc(
        ("meets_drift",),
        "whether the winner's drift meets the bound, computed from it (a drift record that is missing or "
        "lacks the bounded metric does not); `false` also when no configuration met the drift bound and this "
        "file holds the closest candidate instead: its `config`, `runtime`, `environment` and `drift`, with "
        "`metrics`, `launch`, `job` and the speedup `null` (it was never timed) and `selection` saying so",
    ),
    FieldDoc(
        ("study.name", "study.storage"),
        "the study and its storage URL (password hidden)",
    ),
    FieldDoc(
        ("study.trial",),
        "number of the winning trial",
    ),
    FieldDoc(
        ("study.trials",),
        "count of trials per state (`complete`, `pruned`, `fail`, …)",
    ),
    FieldDoc(
        ("objective.name", "objective.direction", "objective.value"),
        "`throughput` (maximize samples/s) or `latency` (minimize median ms per batch), and the winner's "
        "value in its search trial",
    ),
    FieldDoc(
        ("objective.values", "pareto_front"),
        '`direction` is `["maximize", "minimize"]`, `value` the winner\'s samples/s and `values` its '
        "(samples/s, p99 ms); `pareto_front` lists every non-dominated clean trial, fastest first: `trial`, "
        "`throughput_sps`, `p99_ms`, `config`, `config_summary`. The winner is the front's fastest point",
    ),
    FieldDoc(
        ("objective.revalidated_median",),
        "the median of the winner's finalist runs (`null` without a finalist round)",
    ),
    FieldDoc(
        ("selection",),
        "why this trial won: `finalists: beats the runner-up by …` (or `… in each of N interleaved rounds "
        "…`), `finalists: tie within the noise … the simpler config wins`, or `best clean single measurement "
        "(…)` when no finalist round ran after the last trial",
    ),
    FieldDoc(
        ("finalists",),
        "`null`, or the finalist round: `selection`, `order`, `repeats`, `seconds`, `left_out` (the trials "
        "picked but left out because their every round would not fit the time left), and per `candidates` "
        "entry: `trial`, `winner`, `candidate` (false for the baseline when it only ran for the speedup), "
        "`baseline`, `config`, `search_value`, `values` (one per run), `runs` (value, `valid`, `ci_rel`, "
        "`noise_flags`, drift, calls, window), `median`, `min`, `max`, `spread_rel` (half the range over the "
        "median), `noise_rel` (what a gap must exceed to count as a win), all over the clean runs; "
        "`clean_runs` (how many), `eligible` (a majority of its runs clean: only then may it win)",
    ),
    FieldDoc(
        ("scenario",),
        "`offline` (closed loop: `--objective throughput` or `pareto`), `single-stream` (`--objective "
        "latency`) or `server` (`--scenario server`: `objective.name` is `server`, its value a sustained "
        "request rate)",
    ),
    FieldDoc(
        ("server",),
        "the server scenario only: `sustained_rps` (the highest Poisson request rate whose p99 from arrival "
        "to answer stayed within the bound with a steady queue), `slo_ms`, `max_batch` and `max_wait_ms` (the"
        " batching policy; exported by the launch script as `AUTOTUNE_MAX_BATCH`, `AUTOTUNE_MAX_WAIT_MS`), "
        "`upper_bound_rps` (the closed-loop rate the search started below), `batching` (padded), `routing` "
        "(one Poisson stream per instance at rate / instances), `rule` (what sustained means), and `probes`: "
        "per offered rate `rate_rps`, `achieved_rps`, `p50_ms`, `p90_ms`, `p99_ms`, `p99_ci_ms` (95%, order "
        "statistics; `null` below 381 requests), `requests`, `call_mean_ms` and `call_p99_ms` (the model's "
        "calls during the probe, all instances pooled, send to completion: the service time under that load, "
        "which may differ from the closed loop's window; `call_p99_ms` is `null` below 100 calls, as with "
        "large batches, and both are `null` in records written before they were kept), `queue_start`, "
        "`queue_end`, `sustained`, `why`. `metrics.server` holds the full record (each probe's latency "
        "summary and `call_ms` summary, `mean_batch_fill`, `overloaded`, `longest_stall_ms` and `noise_flags` "
        "(a refusal the machine stalled, probed again), `verdict`, `requests_per_call`, `seed`)",
    ),
    FieldDoc(
        ("llm_server",),
        "a language model's server scenario (`--task generate --scenario server`; absent otherwise): "
        "`sustained_rps` (the highest Poisson request rate whose `bounds` held: `ttft_ms` and `tpot_ms` at "
        "`quantile` 99), `saturated_rps` (every request of one probe offered at once: the rate search's "
        "ceiling), `concurrency` (the engine's sequences at once: GenAI's max_num_seqs, llama-server's slots; "
        "the backend's `server_sequences` option, else the config's `batch_size`), `verdict` (why the search "
        "ended there), `seed`, `rule` (what sustained means), and `probes`: per offered `rate_rps`, `load` "
        "(requests, completed, TTFT, TPOT, ITL and E2EL summaries, goodput), `backlog_early` and "
        "`backlog_late` (requests waiting, medians over the first and last quarter of the arrivals), "
        "`overloaded`, `sustained`, `why`",
    ),
    FieldDoc(
        ("model",),
        "how trials built the model: `kind` (`torchvision`, `factory`, `torchscript` or `exported-program`), "
        "`name`, `input_shape` (one sample of the first input), `inputs` (`null` for one float input, else "
        "one `{name, shape, dtype, low, high}` per input, in call order), `weights_path`, `weights_origin` "
        "(`random-init`, `weights-file`, `torch-hub-cache`, `model-file`), `weights_sha256`, `seed`. For a "
        "random init, `weights_path` is the init saved once and shared by every trial",
    ),
    FieldDoc(
        ("config",),
        "the winning `TrialConfig`: `backend`, `precision`, `batch_size`, `allocator`, `instances`, "
        "`threads_per_instance`, `options` (backend options such as `memory_format`, `freezing`), `runtime` "
        "(name), `openmp` (`gnu` / `intel`), `kmp_affinity`, `kmp_blocktime`, `thp`, and in the server "
        "scenario `max_wait_ms`",
    ),
    FieldDoc(
        ("runtime",),
        "the Python environment the winner ran in: `name` (`main`, `ipex`, or a `--runtime`'s folder name), "
        "`python`, `torch`, `python_version`, `packages` (versions there)",
    ),
    FieldDoc(
        ("environment",),
        "exactly the variables the configuration sets on top of a cleaned environment (`OMP_NUM_THREADS`, "
        "`MKL_NUM_THREADS`, `LD_PRELOAD` (allocator, then Intel OpenMP), `MALLOC_CONF`, `KMP_AFFINITY`, "
        "`KMP_BLOCKTIME`, `THP_MEM_ALLOC_ENABLE`, compile caches); the launch commands add `PYTHONPATH` for a"
        " runtime other than `main`",
    ),
    FieldDoc(
        ("launch.pinning",),
        "`numactl` (CPU and memory binding), `numactl-cpu`, `taskset` or `none`",
    ),
    FieldDoc(
        ("launch.pin_prefixes",),
        'per instance, the pinning command prefix (e.g. `["numactl", "--physcpubind=0", "--membind=0"]`); '
        "`autotune export --format sh` builds the launch script from it",
    ),
    FieldDoc(
        ("launch.commands",),
        "one shell command per instance, to be started together; each re-measures its instance from this file"
        " (`python -m autotune.worker --best best.json --instance N`) and prints its result as JSON",
    ),
    FieldDoc(
        ("launch.note",),
        "what the launch commands cannot do by themselves, in words (empty when nothing)",
    ),
    FieldDoc(
        ("job",),
        "what the worker needs to rebuild the winner: model, config, measurement settings, cache folder; its "
        "`format` (`autotune.job/1`) says which layout it is in (a job without one, written before jobs named "
        "their format, is version 1; a worker refuses a version it does not know)",
    ),
    FieldDoc(
        ("metrics.throughput_sps",),
        "samples per second summed over instances, counted in the window in which all instances were running",
    ),
    FieldDoc(
        ("metrics.latency_ms",),
        "per-call latency (one batch; for multi-stream OpenVINO, one batch per stream in flight) `p50`, "
        "`p90`, `p99`, `mean` in milliseconds and the number of `samples`; a percentile needs at least 2 / 10"
        " / 100 samples and is `null` otherwise; `p50_ci` and `p50_ci_rel` (95%, order statistics), "
        "`iqr_rel`, `early_late_rel`",
    ),
    FieldDoc(
        ("metrics.peak_rss_mib", "metrics.peak_rss_mib_total"),
        "peak resident memory of the largest instance, and summed over instances",
    ),
    FieldDoc(
        ("metrics.prepare_s",),
        "building the backend's artifact (ONNX export, OpenVINO conversion, quantization) in its own process;"
        " `0.0` when the cache already had it, and for backends without artifacts",
    ),
    FieldDoc(
        ("metrics.load_s", "metrics.first_call_s"),
        "in the timing process: building the model or loading the artifact; the first call (torch.compile "
        "compiles here); both excluded from the timed window",
    ),
    FieldDoc(
        ("metrics.artifact",),
        "`null`, or `dir`, `cached`, `prepare_s`, `built_in_s` (when cached: how long it took to build), "
        "`details` (exporter, conversion source, quantization method, calibration batches, effective library "
        "versions)",
    ),
    FieldDoc(
        ("metrics.valid",),
        "`false` when every attempt was flagged as noisy (such a trial never wins; kept for the record)",
    ),
    FieldDoc(
        ("metrics.screening",),
        "the screening measurement speed pruning looked at: `throughput_sps`, `p50_ms`, `ci_rel`, `calls`",
    ),
    FieldDoc(
        ("metrics.measurement",),
        "`calls`, `samples`, `common_window_s`, `throughput_ci_rel`, `ci_confidence`, `ci_target_rel`, "
        "`ci_target_met`, `straggler_ratio` (fastest / slowest instance), `combined_early_late_rel` (several "
        "instances: the drift of their time per call together, last third of the common window against the "
        "first; what their noise check judges), `samples_per_call` (batch size × async requests per call for "
        "multi-stream OpenVINO), `pinned` (false: no numactl or taskset, weaker evidence), "
        "`throughput_ci_method`, `warmup`, the clock, `stamps` (per-call timestamp files), `machine` (run "
        "queue and load before/after), `noise_flags`, `attempts` (throughput and flags of each attempt)",
    ),
    FieldDoc(
        ("metrics.instances",),
        "per instance: `pid`, `cpus`, the allocator check (`asked`, `ld_preload`, `mapped`, `verified`), the "
        "thread check, its own throughput, `common_window_sps`, iterations, window, warm-up count and "
        "seconds, `latency_ms` of its own calls, `noise` (`foreign_cpu`, `steal`, `cpu_over_wall_threads`, "
        "context switches per second, CPU and wall seconds)",
    ),
    FieldDoc(
        ("metrics.backend_details",),
        "what the backend reports after loading (OpenVINO: effective precision, streams, threads, requests)",
    ),
    FieldDoc(
        ("metrics.executed_precision",),
        "what the winner's model really executed against the precision its configuration claims, read once "
        "after loading and outside every timed window (`null` in studies from before it was checked): "
        "`claimed`; `status` `ok`, or `unchecked` with the `reason` (fp32, which everything falls back to, is"
        " not checked; nor is a model in which no convolution or matrix product of a known type was seen); "
        "`source` (`OpenVINO runtime model`: the precision each layer of the compiled model runs in; `ONNX "
        "Runtime optimized graph`: quantized operators against float ones between Q/DQ pairs; `oneDNN "
        "primitives` / `ATen operators` for the torch backends: one call under oneDNN's verbose mode and the "
        "torch profiler; `layer weight types` for a language model: torchao's quantized weight tensors); "
        "`counts`: that source's compute layers (convolutions, matrix products) by the precision they ran in "
        "(`int8`, `int4`, `bf16`, `f16`, `f32`, `other`); `evidence`: the counts of every source read; "
        "`probe_s`: what reading it cost. A trial in which no compute layer ran in the claimed precision "
        "never gets here: it FAILs with `precision fallback: …`",
    ),
    FieldDoc(
        ("metrics.generation",),
        "a language model's winner (`--task generate`; `null` otherwise): `ttft_ms` and `tpot_ms` (latency "
        "summaries like `latency_ms`: time to first token per call, time per output token per decode step, "
        "over the calls wholly inside the common window), `tokens_per_s` (generated tokens per second over "
        "all instances: what `throughput_sps` also holds for such a study), `prefill_tokens_per_s`, "
        "`prompt_tokens`, `new_tokens`, `sequences` (concurrent sequences per instance), `generation_ms_mean`"
        " (one call, start to last token), `weight_bytes` (the weights in memory, quantized tensors counted "
        "by what they hold), `quantize_s`",
    ),
    FieldDoc(
        ("metrics.server",),
        "the server scenario's full record (`null` otherwise): what the top-level `server` summarises, with each "
        "probe's latency summary",
    ),
    FieldDoc(
        ("metrics.torch_version",),
        "torch version the winner ran with",
    ),
    FieldDoc(
        ("measure_settings",),
        "warm-up minimum iterations and seconds, cap and steadiness tolerance; window minimum seconds and "
        "calls, cap, CI confidence and target; screening seconds and calls",
    ),
    FieldDoc(
        ("drift",),
        "every metric of the winner against FP32 eager: `relative_l2` (‖y − y_ref‖ / ‖y_ref‖ over the "
        "evaluation set), `cosine_similarity` (mean over samples), `top1_agreement`, and with labels "
        "`accuracy`, `reference_accuracy`, `accuracy_delta`; `samples`; `reused_from` (the trial that "
        "measured it, when the winner shares its numerics); a language model's also `perplexity`, "
        "`reference_perplexity`, `perplexity_increase`, `greedy_agreement` and `kl_divergence` (mean KL "
        "divergence of the next-token distributions from FP32's, in nats; `top1_agreement` is then the share "
        "of positions whose top token is FP32's). Then the criterion: `metric` (`relative_l2`, `cosine`, `top1`, "
        "`accuracy`, `perplexity`, `kld`), its `drop` from FP32, `max_drift`, `relative` (the bound is a share "
        "of FP32's value), `criterion` in words; `data` (what it was measured on, in words), `evaluation` "
        "(`data`, `samples`, `labels`, `reference_accuracy`, `synthetic`) and `calibration` (`data`, "
        "`digest`, `samples`, `after_eval`: where the calibration split starts in the shuffled data, `null` "
        "for separate calibration data); `reference`: `null`, or, when the FP32 outputs were the same for "
        "every evaluation input (a zero-initialised head on a random init), what drift was measured on "
        "instead: `constant_outputs` (true), `varying_layer` (the last module whose output varies with the "
        "input), `redrawn` (the all-zero head weights redrawn, seeded, in the random init every trial loaded:"
        " the outputs compared are a random projection of `varying_layer`'s), `drift_measurable` (true in any"
        " best.json: a search whose drift could not be measured is refused) and `message` (the line the "
        "search printed). Absent in files written before it existed",
    ),
    FieldDoc(
        ("baseline",),
        "the eager fp32 baseline trial: number, config, throughput and latency, and in the server scenario "
        "its `sustained_rps` (or `null` if the space had none)",
    ),
    FieldDoc(
        ("speedup_vs_baseline", "speedup_source"),
        "winner throughput / baseline throughput (the server scenario: sustained rates): from the medians of "
        "the interleaved finalist runs when there are some, else from the two search trials",
    ),
    FieldDoc(
        ("fingerprint.hardware",),
        "CPU model, ISA flags, physical cores, allowed CPUs, SMT, NUMA nodes, memory",
    ),
    FieldDoc(
        ("fingerprint.software",),
        "Python, package versions, allocator libraries (resolved paths, with versions in their names), libc, kernel",
    ),
    FieldDoc(
        ("fingerprint.host",),
        "host name of the machine that created the study",
    ),
    FieldDoc(
        ("sequences.total", "sequences.instances", "sequences.per_instance"),
        "text generation: the winner's concurrent sequences in all, and their split (`instances` x `per_instance`)",
    ),
    FieldDoc(
        ("sequences.meaning",),
        '`"total"`: the study\'s `sequences` counted every instance\'s together; `"per instance"`: a study stored '
        "before they did (its trials ran `sequences` on each instance)",
    ),
    FieldDoc(
        ("sequences.by_total",),
        "each total the study measured with its best clean trial (`total`, `trial`, `value`, `instances`, "
        "`per_instance`, `config`), fewest first: the winner is the fastest of them",
    ),
    FieldDoc(
        ("mix.compressed_share", "mix.low_type", "mix.kept_type"),
        "a mixed-precision winner: the share of the ranked weights in `low_type` (the trial's type), least "
        "sensitive matrices first; the rest, the output layer and the token embedding in `kept_type`",
    ),
    FieldDoc(
        ("mix.kept_layers", "mix.compressed_layers"),
        "the matrices kept in `kept_type` by module name, most sensitive first, and how many are in `low_type`",
    ),
    FieldDoc(
        ("mix.sensitivity_method", "mix.executed"),
        "how the matrices were ranked, and the file's matrices by type as it ran (the check that it holds the mix)",
    ),
)


def _record_fields(record: type) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(record)
    return {f.name: hints[f.name] for f in dataclasses.fields(record) if f.name not in ("extra", "absent")}


def _nested(name: str) -> type | None:
    """The record type of a top-level field whose own fields are described one by one."""
    return BestJson.NESTED.get(name)


def _documented() -> set[str]:
    return {path for row in FIELDS for path in row.paths}


def undocumented() -> list[str]:
    """Fields of best.json's records that no row describes: a top-level field counts as described when a
    row names it or, for a nested record described field by field, each of its fields."""
    documented = _documented()
    missing = []
    for name in _record_fields(BestJson):
        if name in documented:
            continue
        nested = _nested(name)
        prefixed = [path for path in documented if path.startswith(name + ".")]
        if not prefixed:
            missing.append(name)
        elif nested is not None:
            missing += [f"{name}.{sub}" for sub in _record_fields(nested) if f"{name}.{sub}" not in documented]
    return missing


def unknown() -> list[str]:
    """Rows' paths that name no field of best.json's records (a field renamed or gone, its row left)."""
    top = _record_fields(BestJson)
    wrong = []
    for path in sorted(_documented()):
        name, _, sub = path.partition(".")
        nested = _nested(name)
        if name not in top or (sub and nested is not None and sub not in _record_fields(nested)):
            wrong.append(path)
    return wrong


def fields_table() -> str:
    """The Markdown table of best.json's fields."""
    lines = ["| field | meaning |", "| --- | --- |"]
    for row in FIELDS:
        lines.append(f"| {', '.join(f'`{p}`' for p in row.paths)} | {row.text} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(fields_table())

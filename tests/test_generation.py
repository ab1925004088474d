"""Text generation, end to end in real processes: a tiny Llama-architecture decoder trained inside the
test on the standard library's docstrings, searched over precisions with perplexity bounded on held-out
text; TTFT and TPOT checked against the stopwatch's own call times; bad input refused in one line."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from conftest import GENERATE, LM, assert_trials_ran, generation_space, load_study, tiny

from autotune.records.job import WorkerJob
from autotune.records.metrics import TrialMetrics


def eager_space(path: Path, precisions: list[str], sequences: tuple[int, ...] = (2,)) -> Path:
    # the tiny model's layers are 64 wide: int4 groups of 32
    eager = {"precision": precisions, "kv_cache": ["dynamic"], "group_size": [32]}
    return generation_space(path, {"eager": eager}, sequences)


def test_trained_model_search_keeps_int8_within_perplexity_and_times_tokens(searcher, workdir, trained):
    """fp32/woq_int8/da8w8/woq_int4 on a model that learned real text: the int8 and int4 ones keep
    perplexity within 2%, int4 weights take less memory than int8, and every trial's TTFT +
    (new_tokens - 1) x mean TPOT matches the stopwatch's call time. The winner then goes through what a
    user does with it: autotune.load(), the report, the launch script and verify --through-load."""
    assert trained["perplexity"] < 40, "the tiny model did not learn the text (byte perplexity near 256 is chance)"
    space = eager_space(workdir / "space.yaml", ["fp32", "woq_int8", "da8w8", "woq_int4"])  # bf16: below
    result = searcher.generate(
        "--budget", "8m", "--measure-seconds", "0.5s-1.5s", space=space, trials=4, trained=trained
    )
    # A machine busy with other work flags every measurement noisy and exports no winner: the numbers
    # checked below are still measured and recorded, so only that outcome is tolerated.
    all_noisy = "was flagged as noisy" in result.stderr
    assert result.returncode == 0 or (result.returncode == 2 and all_noisy), result.stdout + result.stderr
    assert "task: generate, prompt 32 tokens, 8 new tokens" in result.stdout
    assert "tokens/s" in result.stdout
    study = load_study(workdir, "tiny_llama")
    complete = {t.user_attrs["config"]["precision"]: t for t in study.trials if t.state.name == "COMPLETE"}
    assert {"woq_int8", "da8w8", "woq_int4"} <= set(complete), [
        (t.state.name, t.user_attrs.get("prune_reason")) for t in study.trials
    ]
    weights = {}
    for precision, trial in complete.items():
        metrics = TrialMetrics.from_trial_attrs(trial.user_attrs)
        drift, generation = metrics.drift, metrics.generation
        assert generation is not None and drift is not None
        assert drift.reference_perplexity < 40
        if precision in ("woq_int8", "da8w8", "woq_int4"):
            assert drift.perplexity_increase <= 0.02, (precision, drift)
        # The token stamps split each call: prefill plus (new_tokens - 1) decode steps is the call the
        # stopwatch timed on its own clock reads (call start, return), within a few percent.
        from_tokens = generation.ttft_ms.mean + (generation.new_tokens - 1) * generation.tpot_ms.mean
        assert from_tokens == pytest.approx(metrics.latency_ms.mean, rel=0.05), (precision, generation)
        assert generation.ttft_ms.samples == metrics.latency_ms.samples
        assert generation.tpot_ms.samples == metrics.latency_ms.samples * (generation.new_tokens - 1)
        # Generated tokens per second: the calls' tokens over the window they filled.
        assert metrics.throughput_sps == pytest.approx(
            generation.sequences * generation.new_tokens * 1e3 / metrics.latency_ms.mean, rel=0.25
        )
        weights[precision] = generation.weight_bytes
    assert weights["woq_int8"] < 0.6 * weights["fp32"], weights
    # half a byte per weight plus an fp32 scale and zero per group of 32 (the embedding stays fp32)
    assert weights["woq_int4"] < 0.9 * weights["woq_int8"], weights
    if not all_noisy:
        best_path = workdir / "studies" / "tiny_llama" / "best.json"
        best = json.loads(best_path.read_text())
        assert best["metrics"]["generation"]["tpot_ms"]["p50"] > 0
        evaluation = best["drift"]["evaluation"]  # drift was read from the held-out text, not random inputs
        assert evaluation["data"] == str(trained["text"]) and not evaluation["synthetic"], evaluation
        import torch

        import autotune

        generate = autotune.load(best_path, check_environment=False)  # the winner, as a program gets it
        prompt = torch.tensor([(list(text) * 2)[:32] for text in (b"def load(path):\n    ", b"Return the number of ")])
        tokens = generate(prompt)
        assert tokens.shape == (2, 8) and tokens.dtype == torch.long
        assert torch.equal(tokens, generate(prompt.numpy())), "greedy decoding is deterministic"
        report = searcher("report", "--study", "tiny_llama")
        assert report.returncode == 0, report.stderr
        html = (workdir / "studies" / "tiny_llama" / "report.html").read_text()
        assert "tokens/s (one search measurement)" in html and "TPOT p99 ms" in html
        exported = searcher("export", "--study", "tiny_llama", "--format", "sh")
        assert exported.returncode == 0, exported.stderr
        assert "2 sequence(s) of 32 prompt tokens, 8 new tokens each" in (best_path.parent / "launch.sh").read_text()
        verified = searcher("verify", str(best_path), "--repeats", "1", "--through-load", timeout=600)
        assert verified.returncode in (0, 1, 3), verified.stdout + verified.stderr
        assert "tokens/s here" in verified.stdout or "no verdict" in verified.stdout, verified.stdout
        # through the launch script and autotune.load(): a plain loop counting the tokens it gets back
        assert "through autotune.load():" in verified.stdout and "16 tokens in" in verified.stdout, verified.stdout
        compared = searcher("compare", "--best", str(best_path), "--repeats", "1", timeout=600)
        assert compared.returncode == 0, compared.stdout + compared.stderr
        assert re.search(r"repeat 1/1 winner +[\d.]+ tokens/s", compared.stdout), compared.stdout
        assert "TPOT" in compared.stdout and "TTFT" in compared.stdout, compared.stdout
        refused = searcher("compare", "--best", str(best_path), "--independent", "2s")
        assert refused.returncode == 2 and "not a text generation winner" in refused.stderr, refused.stderr


def test_quantization_that_breaks_the_model_is_pruned_on_perplexity_before_timing(
    searcher, workdir, trained, monkeypatch
):
    """The same trained model with LLM-style activation outliers: DA8W8 (per-token activation scales)
    loses the other channels to the outlier's range and is pruned on drift, with no timed window;
    weight-only int8 keeps perplexity and is timed, and so does SmoothQuant, which moves the outlier
    into the weights before quantizing activations (what it was made for)."""
    monkeypatch.setenv("AUTOTUNE_TEST_LM_WEIGHTS", str(trained["weights"]))
    space = eager_space(workdir / "space.yaml", ["woq_int8", "da8w8", "smoothquant_int8"])
    result = searcher.generate(
        *("--data", str(trained["text"]), "--drift-metric", "perplexity", "--max-drift", "5%", "--budget", "6m"),
        model="outlier_llama",
        space=space,
        trials=3,
    )
    all_noisy = "was flagged as noisy" in result.stderr
    assert result.returncode == 0 or (result.returncode == 2 and all_noisy), result.stdout + result.stderr
    study = load_study(workdir, "outlier_llama")
    by_precision = {t.user_attrs["config"]["precision"]: t for t in study.trials}
    broken, kept, smoothed = by_precision["da8w8"], by_precision["woq_int8"], by_precision["smoothquant_int8"]
    assert broken.state.name == "PRUNED" and broken.user_attrs["prune_reason"].startswith("drift: perplexity")
    assert broken.user_attrs["drift"]["perplexity_increase"] > 0.05
    broken_dir = workdir / "studies" / "outlier_llama" / "trials" / f"{broken.number:05d}"
    assert list(broken_dir.glob("job-*.json")), "the trial was launched"
    assert not list(broken_dir.glob("stamps-*.npy")), "a trial pruned on drift is never timed"
    # ... nor warmed up: its drift, beyond the bound, sends it straight to the barrier that prunes it.
    assert broken.user_attrs["budget"]["warmup_s"] == 0.0, broken.user_attrs["budget"]
    assert kept.user_attrs["budget"]["warmup_s"] > 0.0, kept.user_attrs["budget"]
    assert kept.state.name == "COMPLETE" and kept.user_attrs["drift"]["perplexity_increase"] <= 0.05
    assert smoothed.state.name == "COMPLETE" and smoothed.user_attrs["drift"]["perplexity_increase"] <= 0.05


def test_a_language_models_drift_is_reused_at_the_same_sequences_only(searcher, workdir, trained):
    """A language model's drift is measured at the timed sequences (its decode steps run the batch's
    kernels: inductor's one-row int8 GEMM decoded garbage where eight rows did not), so a trial of the same
    numerics reuses it only at the same sequences and measures its own at others."""
    space = eager_space(workdir / "space.yaml", ["fp32", "bf16"], sequences=(1, 2))

    def search(trials: int):
        return searcher.generate("--budget", "6m", "--max-drift", "5%", space=space, trials=trials, trained=trained)

    # the baseline and both coverage trials (fp32's at 2 sequences is not the baseline's), in the CPU's order
    first = search(3)
    assert first.returncode in (0, 2), first.stdout + first.stderr
    study = load_study(workdir, "tiny_llama")
    measured = next(t for t in study.trials if t.user_attrs.get("config", {}).get("precision") == "bf16")
    assert measured.user_attrs["drift"]["reused_from"] is None, measured.user_attrs
    sequences = measured.params["sequences"]
    baseline = next(t for t in study.trials if t.user_attrs.get("baseline"))
    # the baseline runs one sequence, the coverage round the most the space lists (tuning/layouts.coverage_batch)
    assert (baseline.params["sequences"], sequences) == (1, 2), measured.user_attrs["order"]
    assert "; 2 sequences, the most the space lists within 8x" in measured.user_attrs["order"]
    for other in (3 - sequences, sequences):  # what the search enqueues itself always runs
        study.enqueue_trial({**measured.params, "sequences": other}, user_attrs={"order": "enqueued by the search"})
    again = search(2)
    assert again.returncode in (0, 2), again.stdout + again.stderr
    trials = load_study(workdir, "tiny_llama").trials
    later = [t for t in trials[measured.number + 1 :] if "drift" in t.user_attrs]
    runs = [(t.number, t.params["sequences"], t.user_attrs["drift"]["reused_from"]) for t in later]
    for _, at, reused_from in runs:  # reused only from a trial at its own sequences
        assert reused_from is None or trials[reused_from].params["sequences"] == at, runs
    assert any(at == 3 - sequences and reused_from is None for _, at, reused_from in runs), runs
    assert any(at == sequences and reused_from == measured.number for _, at, reused_from in runs), runs


def test_eval_samples_is_the_number_of_drift_prompts_and_a_study_from_before_it_resumes(searcher, workdir):
    """--eval-samples N measures a language model's drift on N prompts (4 when it says nothing: a
    classifier's 32 would cost every trial eight times the evaluation); a resumed study keeps its number, and
    a study stored before the workload held it (which measured 4, whatever its eval_samples said) resumes."""
    import torch

    space = eager_space(workdir / "space.yaml", ["fp32"], sequences=(1,))
    six = searcher.generate("--eval-samples", "6", "--study", "six", space=space, trials=1)
    assert_trials_ran(six)
    saved = torch.load(workdir / "studies" / "six" / "reference" / "reference.pt", weights_only=True)
    assert saved["prompts"].shape[0] == 6
    stored = load_study(workdir, "six").user_attrs["spec"]
    assert stored["generation"]["drift_prompts"] == 6 and stored["eval_samples"] == 6
    changed = searcher.generate("--eval-samples", "8", "--study", "six", space=space, trials=1)
    assert changed.returncode == 2 and "drift_prompts" in changed.stderr, changed.stderr

    default = searcher.generate("--study", "four", space=space, trials=1)
    assert_trials_ran(default)
    saved = torch.load(workdir / "studies" / "four" / "reference" / "reference.pt", weights_only=True)
    assert saved["prompts"].shape[0] == 4
    study = load_study(workdir, "four")
    before = {**study.user_attrs["spec"], "eval_samples": 32}  # as a study of the earlier layout stored it
    before["generation"] = {k: v for k, v in before["generation"].items() if k != "drift_prompts"}
    study.set_user_attr("spec", before)
    resumed = searcher.generate("--study", "four", space=space, trials=1)
    assert_trials_ran(resumed)
    assert "resuming study 'four'" in resumed.stdout, resumed.stdout + resumed.stderr


@pytest.mark.parametrize(
    ("model", "extra", "message"),
    [
        (tiny(), ["--task", "generate"], "--task generate needs a causal language model"),
        (f"{LM}:tiny_llama", ["--new-tokens", "0"], "--new-tokens must be 1 or more"),
        (f"{LM}:tiny_llama", ["--prompt-tokens", "300"], "exceeds the 256-token context"),
        (f"{LM}:tiny_llama", ["--sequences", "0"], "counts must be 1 or more"),
        (f"{LM}:tiny_llama", ["--scenario", "server", *GENERATE], "give --ttft-slo-ms and/or --tpot-slo-ms"),
        (f"{LM}:tiny_llama", ["--scenario", "server", "--slo-ms", "50", *GENERATE], "(not --slo-ms)"),
    ],
)
def test_bad_generation_input_is_one_line_and_exit_2(cli, model, extra, message):
    result = cli("search", "--model", model, *extra, "--budget", "1m", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, result.stderr


def test_perplexity_bound_reads_a_percentage():
    from autotune.measure.drift import Drift, DriftCriterion

    criterion = DriftCriterion.parse("perplexity", "2%")
    record = Drift(0.01, 0.99, 0.98, 64, perplexity=10.3, reference_perplexity=10.0, perplexity_increase=0.03)
    assert criterion.exceeded(record) and not DriftCriterion.parse("perplexity", "5%").exceeded(record)
    assert criterion.exceeded(Drift(0.01, 0.99, 0.98, 64)), "no perplexity measured: not kept"
    assert math.isclose(criterion.max_drop, 0.02)


def test_probe_says_which_generation_precisions_each_runtime_runs_and_why_not(cli, workdir):
    """Each runtime is tried in its own process: fp32 always runs; a precision left out says why."""
    from autotune.backends.generation import PRECISIONS

    result = cli("probe")
    assert result.returncode == 0, result.stderr
    prefix = "text generation in runtime main:"
    line = next(line for line in result.stdout.splitlines() if line.startswith(prefix))
    runs, _, left_out = line.removeprefix(prefix).partition(" run")
    assert "fp32" in runs and "woq_int4" in runs  # torchao 0.18's CPU int4 packing, in the main runtime
    named = [p for p in PRECISIONS if f" {p}," in runs + "," or f" {p} left out:" in left_out]
    assert sorted(named) == sorted(PRECISIONS), line  # every precision is either run or left out with a reason
    # llama.cpp, which make setup builds: listed with the GGUF types it runs here, or why not
    engine = next(line for line in result.stdout.splitlines() if line.startswith("text generation engine llamacpp"))
    llamacpp_types = ("F32", "BF16", "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q2_K")
    assert engine.endswith(", ".join(llamacpp_types) + " run"), engine
    # OpenVINO, exported by the optimum-intel overlay make setup installs
    engine = next(line for line in result.stdout.splitlines() if line.startswith("text generation engine openvino"))
    assert engine.endswith("fp32, fp16, int8_asym, int4_sym, int4_asym run"), engine
    # IPEX's ipex.llm.optimize imports only with torch 2.8: probed in, and routed to, the IPEX runtime
    engine = next(line for line in result.stdout.splitlines() if line.startswith("text generation engine ipex"))
    assert engine.endswith("bf16, woq_int8, woq_int4, fp32 run in runtime ipex"), engine
    nowhere = str(workdir / "nowhere")
    missing = cli("probe", env={"AUTOTUNE_LLAMA_CPP_CONVERTER": nowhere, "AUTOTUNE_OPTIMUM_INTEL": nowhere})
    assert f"left out: llama.cpp's converter is not in {nowhere}" in missing.stdout, missing.stdout
    assert f"left out: optimum-intel is not in {nowhere}; make setup installs it" in missing.stdout, missing.stdout
    # as JSON: PyTorch's precisions apart from the engines, each engine with its types or its reason
    report = json.loads(cli("probe", "--json", env={"AUTOTUNE_OPTIMUM_INTEL": nowhere}).stdout)
    assert not set(report["generation_precisions_unavailable"]) & {"llamacpp", "openvino"}, report
    assert report["generation_engines"]["llamacpp"] == {
        "runs": True,
        "runtime": "main",
        "precisions": list(llamacpp_types),
    }
    assert report["generation_engines"]["ipex"]["runtime"] == "ipex", report["generation_engines"]
    assert report["generation_engines"]["openvino"]["runs"] is False
    assert "optimum-intel is not in" in report["generation_engines"]["openvino"]["reason"]


def test_a_quantized_model_is_prepared_once_and_later_trials_only_load_it(workdir, trained):
    """int4 weights quantized by the prepare process, cached by numerics: a second trial with another KV
    cache and batch loads them (no preparation), and its logits drift is the first one's (to float rounding:
    the decode steps compared run with another batch and KV cache). Both run the bf16 activations the
    weights were quantized with (A16W4), and fp32 activations are other weights, built apart."""
    from autotune.machine.probe import probe_machine
    from autotune.measure.stopwatch import MeasureSettings
    from autotune.model.generation import GenerationWorkload
    from autotune.model.sources import resolve_model
    from autotune.records.config import TrialConfig
    from autotune.runner.trials import TrialContext, compute_reference, run_config

    source = resolve_model(f"{LM}:tiny_llama", str(trained["weights"]), "input_ids:int64:32:0-256")
    workload = GenerationWorkload(32, 8, 256, 256, str(trained["text"]))
    reference = compute_reference(source, workdir / "study", 4, 300, generation=workload)
    measure = MeasureSettings(warmup_min_s=0.2, window_min_s=0.3, window_max_s=1.0, screen_s=0.0)
    ctx = TrialContext(probe_machine(), reference, measure, workdir / ".cache", noisy_retries=0)
    runs = []
    for sequences, kv_cache in ((2, "dynamic"), (1, "static")):
        options = {"group_size": 32, "kv_cache": kv_cache, "activations": "bf16"}
        config = TrialConfig("eager", "woq_int4", sequences, threads_per_instance=1, options=options)
        runs.append(run_config(config, ctx, workdir / f"trial-{kv_cache}", 600)[0])
    first, second = runs
    assert first.backend_details is not None and second.backend_details is not None
    assert first.backend_details["float_dtype"] == second.backend_details["float_dtype"] == "bfloat16"
    assert first.artifact is not None and second.artifact is not None
    assert not first.artifact.cached and first.prepare_s > 0
    assert second.artifact.cached and second.prepare_s == 0.0 and second.artifact.dir == first.artifact.dir
    assert second.backend_details is not None and "load_quantized_s" in second.backend_details
    assert first.generation is not None and second.generation is not None
    assert first.backend_details is not None and "load_quantized_s" in first.backend_details  # built, then loaded
    assert first.generation.quantize_s is not None and first.generation.quantize_s > 0  # what building it cost
    assert first.drift is not None and second.drift is not None  # the same weights: the same logits, to rounding
    assert second.drift.relative_l2 == pytest.approx(first.drift.relative_l2, rel=1e-4)
    assert second.drift.perplexity == pytest.approx(first.drift.perplexity, rel=1e-6)
    # a trial whose artifact was evicted in the meantime quantizes by itself rather than failing
    import shutil

    shutil.rmtree(first.artifact.dir)
    options = {"group_size": 32, "activations": "bf16"}
    config = TrialConfig("eager", "woq_int4", 1, threads_per_instance=1, options=options)
    job = WorkerJob(
        task="trial",
        model=reference.model,
        generation=workload,
        artifact_dir=first.artifact.dir,
    )
    from autotune.worker.generate import build_generation_runner

    runner = build_generation_runner(job, config)
    assert "load_quantized_s" not in runner.details and runner.details["quantize_s"] > 0
    assert runner.details["float_dtype"] == "bfloat16"
    # fp32 activations: other weights (quantized from the fp32 model), so another artifact
    options = {"group_size": 32, "kv_cache": "static", "activations": "fp32"}
    config = TrialConfig("eager", "woq_int4", 1, threads_per_instance=1, options=options)
    third = run_config(config, ctx, workdir / "trial-fp32", 600)[0]
    assert third.artifact is not None and not third.artifact.cached and third.artifact.dir != first.artifact.dir
    assert third.backend_details is not None and third.backend_details["float_dtype"] == "float32"
    assert second.executed_precision is not None and second.executed_precision.counts.get("int4", 0) > 0


def test_two_splits_of_one_total_run_the_same_sequences_and_tokens_per_call(searcher, workdir):
    """`--sequences 2` is the total: the baseline runs both on one instance, the layout round's split runs one
    on each of two, and both generate 2 x new_tokens tokens per call; best.json, show and the winner's line
    say the split."""
    space = workdir / "space.yaml"
    generation_space(space, {"eager": {"precision": ["fp32"], "kv_cache": ["dynamic"]}}, sequences=(2,))
    data = yaml.safe_load(space.read_text())
    space.write_text(yaml.safe_dump({**data, "instances": [1, 2]}))
    result = searcher.generate("--no-speed-pruning", space=space, trials=2)
    assert_trials_ran(result)
    study = load_study(workdir, "tiny_llama")
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    splits = {}
    for trial in complete:
        config = trial.user_attrs["config"]
        generation = TrialMetrics.from_trial_attrs(trial.user_attrs).generation
        assert generation is not None and generation.sequences == config["batch_size"]
        tokens_per_call = generation.sequences * generation.new_tokens * config["instances"]
        splits[config["instances"], config["batch_size"]] = (trial.params["sequences"], tokens_per_call)
    assert splits == {(1, 2): (2, 16), (2, 1): (2, 16)}, splits
    shown = searcher("show", "--study", "tiny_llama")
    assert shown.returncode == 0, shown.stderr
    assert "2 = 2 x 1" in shown.stdout and "2 = 1 x 2" in shown.stdout, shown.stdout
    if result.returncode == 0:
        best = json.loads((workdir / "studies" / "tiny_llama" / "best.json").read_text())
        split = best["sequences"]
        assert split["total"] == 2 and split["meaning"] == "total"
        assert split["instances"] * split["per_instance"] == 2
        assert [row["total"] for row in split["by_total"]] == [2]


def test_the_coverage_reaches_every_engine_early_and_a_study_names_those_it_never_tried(searcher, workdir):
    """The engine round on a tiny Llama: after the baseline, one trial per engine, the cheapest to prepare
    first (torchao's quantization in eager, OpenVINO's export, llama.cpp's conversion), so every engine
    listed is reached within the first N = 4 trials, ahead of eager's bf16; a run stopped after 2 trials
    names the engines it never tried, and the same command resumes with them."""
    space = generation_space(
        workdir / "space.yaml",
        {
            "eager": {"precision": ["fp32", "bf16", "woq_int8"], "kv_cache": ["dynamic"]},
            "llamacpp": {"precision": ["Q8_0"]},
            "openvino": {"precision": ["int8_asym"]},
        },
    )
    first = searcher.generate(space=space, trials=2)
    assert_trials_ran(first)
    assert "engines never tried: llamacpp: its coverage trial was still held" in first.stdout, first.stdout
    assert "openvino: its coverage trial was still held" in first.stdout, first.stdout
    again = searcher.generate(space=space, trials=2)
    assert_trials_ran(again)
    assert "engines never tried" not in again.stdout, again.stdout
    study = load_study(workdir, "tiny_llama")
    engines = [
        "torchao" if (config := t.user_attrs["config"])["precision"] == "woq_int8" else config["backend"]
        for t in study.trials[:4]
    ]
    assert engines == ["eager", "torchao", "openvino", "llamacpp"], engines
    assert all("engine round" in t.user_attrs["order"] for t in study.trials[1:4])

"""IPEX's `ipex.llm.optimize` as a text-generation engine, in real processes: it imports only with torch
2.8, so its trials run in the IPEX runtime (.venv-ipex, which `make setup` builds with IPEX 2.8's own
transformers), fed the same tiny Llama as every backend, its drift measured against FP32 eager computed in
the main runtime."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from conftest import assert_trials_ran, generation_space, load_study, rerun_while_noisy

from autotune.machine.runtimes import runtime_env
from autotune.records.metrics import TrialMetrics

TESTS = Path(__file__).resolve().parent

# Runs in the IPEX runtime: the engine against transformers' own FP32 model there, on the same ids.
SAME_IDS = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import tiny_lm
from autotune.backends.generation import Generator, prepare
from autotune.records.config import TrialConfig

out = {}
for precision in ("fp32", "woq_int8"):
    torch.manual_seed(0)
    model = tiny_lm.tiny_llama().eval()
    ids = torch.randint(0, 256, (3, 100), generator=torch.Generator().manual_seed(1))
    reference = Generator(model, 6)
    greedy, expected = reference.generate_with_logits(ids, 16)
    own = reference.generate(ids, stamp=False)
    torch.manual_seed(0)
    config = TrialConfig("ipex", precision, batch_size=3, threads_per_instance=1, options={"lowp_mode": "int8"})
    engine, details = prepare(tiny_lm.tiny_llama().eval(), config, 6)
    tokens, logits = engine.generate_with_logits(ids, 16, forced=greedy)
    untimed = len(engine.token_stamps)
    generated = engine.generate(ids)
    out[precision] = {
        "forced_tokens_equal": bool(torch.equal(tokens, greedy)),
        "greedy_equal": bool(torch.equal(generated, own)),
        "shapes": [list(logits.shape), list(expected.shape)],
        "relative_error": float((logits - expected).norm() / expected.norm()),
        "stamps": [untimed, len(engine.token_stamps)],
        "counts": engine.probe(None, "woq_int8").counts,
        "details": details,
    }
print(json.dumps(out))
"""


def test_ipex_llm_optimize_computes_what_transformers_fp32_computes_and_stamps_each_token(ipex_runtime):
    """In the IPEX runtime, the optimized fp32 model fed FP32's tokens predicts them with FP32's logits
    (prefill positions and decode steps), its `generate` decodes FP32's greedy tokens with one stamp per
    token (none in the drift pass), and weight-only int8 runs IPEX's int8 kernels in every linear layer."""
    runtime = ipex_runtime
    done = subprocess.run(
        [runtime.python, "-c", SAME_IDS, str(TESTS)],
        capture_output=True,
        text=True,
        timeout=600,
        env=runtime_env(runtime, {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    fp32, int8 = out["fp32"], out["woq_int8"]
    assert fp32["forced_tokens_equal"] and fp32["greedy_equal"], fp32
    assert fp32["shapes"] == [[3, 16 + 5, 256]] * 2
    assert fp32["relative_error"] < 1e-4, fp32
    assert fp32["stamps"] == [0, 6]
    assert fp32["details"]["engine"].startswith("ipex.llm.optimize (IPEX 2.8")
    # 2 layers x (fused q/k/v, o, gate, up, down) and the output layer, each in IPEX's int8 kernel
    assert int8["counts"] == {"int8": 11}, int8
    assert int8["details"]["weight_bytes"] < fp32["details"]["weight_bytes"] / 2
    assert int8["relative_error"] < 0.05, int8


def test_a_trained_models_woq_int8_keeps_perplexity_in_the_ipex_runtime_and_its_tokens_account_for_the_call(
    searcher, workdir, trained, ipex_runtime
):
    """A search from the main runtime sends IPEX's trials to the IPEX runtime: weight-only int8 keeps the
    trained model's perplexity within 2% of FP32 eager's (computed in the main runtime), says it ran in
    int8, and its tokens' stamps account for the timed call; the winner re-measures through the launch
    script and autotune.load() in that runtime."""
    space = generation_space(
        workdir / "space.yaml",
        {"ipex": {"precision": ["woq_int8"], "lowp_mode": ["int8"]}},  # bf16: tests/test_precision.py
        sequences=(2, 1),
    )
    result = searcher.generate(space=space, trials=2, trained=trained)
    assert_trials_ran(result)
    assert "ipex runs in runtime ipex" in result.stdout, result.stdout[-3000:]
    study = load_study(workdir, "tiny_llama")
    trials = [t for t in study.trials if t.user_attrs.get("config", {}).get("backend") == "ipex"]
    done = [t for t in trials if t.state.name == "COMPLETE" and t.user_attrs["config"]["precision"] == "woq_int8"]
    assert done, [(t.state.name, t.user_attrs.get("fail_cause"), t.user_attrs.get("prune_reason")) for t in trials]
    for trial in done:
        assert trial.user_attrs["config"]["runtime"] == "ipex"
        assert trial.user_attrs["runtime"]["torch"].startswith("2.8"), trial.user_attrs["runtime"]
        metrics = TrialMetrics.from_trial_attrs(trial.user_attrs)
        drift, generation = metrics.drift, metrics.generation
        assert drift is not None and generation is not None
        assert drift.perplexity_increase <= 0.02, drift
        assert trial.user_attrs["executed_precision"]["counts"] == {"int8": 11}
        # generate's own work after the last token (its output assembled) is all the stamps leave out
        from_tokens = generation.ttft_ms.mean + (generation.new_tokens - 1) * generation.tpot_ms.mean
        tail_ms = metrics.latency_ms.mean - from_tokens
        assert -0.05 * metrics.latency_ms.mean <= tail_ms <= max(0.1 * metrics.latency_ms.mean, 1.0), tail_ms
    best = json.loads((workdir / "studies" / "tiny_llama" / "best.json").read_text())
    assert (best["config"]["backend"], best["runtime"]["name"]) == ("ipex", "ipex"), best["config"]
    # The two stopwatches on the winner agree: before, the protocol run was timed while the compile-worker
    # pool that importing IPEX starts was still starting (its CPU counted as other processes'), and ran at
    # 0.4x the speed measured through autotune.load() (a +150% gap). One pair of 0.5 s windows on a shared
    # 2-core machine differs by up to about 11% (+4.5%, +9.1%, -11.2% seen), past verify's ±10% noise
    # margin once in a while: the bound is 25%, well short of the old gap.
    verified = rerun_while_noisy(
        lambda: searcher("verify", "studies/tiny_llama/best.json", "--repeats", "1", "--through-load", timeout=600)
    )
    assert verified.returncode in (0, 1), verified.stdout + verified.stderr  # 1: slower than the search recorded
    gap = re.search(r"([+-][\d.]+)% from the protocol's", verified.stdout)
    margin = re.search(r"differences within ±(\d+)% are noise", verified.stdout)
    assert gap and margin, verified.stdout
    assert abs(float(gap.group(1))) <= max(25.0, float(margin.group(1))), verified.stdout
    assert "other processes used" not in verified.stdout, verified.stdout

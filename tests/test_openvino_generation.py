"""OpenVINO as a text-generation engine, in real processes: the tiny Llama (random init, and the one
trained on the standard library's docstrings) exported by optimum-intel's own command with NNCF's
weight compression, run by the OpenVINO runtime's CPU plugin, its drift measured against FP32 eager like
any backend's."""

from __future__ import annotations

import torch
from conftest import assert_trials_ran, generation_space, load_study

from autotune.common.cpuinfo import bf16_tiles
from autotune.records.config import TrialConfig
from autotune.records.metrics import TrialMetrics


def test_an_fp32_ir_computes_what_pytorch_fp32_computes_and_its_prefill_keeps_the_last_logits_only():
    """optimum-intel's fp32 IR on the same ids: the drift pass's infer request computes the same logits
    (prefill positions and decode steps, teacher-forced) as PyTorch's FP32 model, and its output layer
    sees as many positions as asked; openvino-genai's pipeline, which the timed calls run, decodes the same
    greedy tokens as PyTorch and as that infer request, with one stamp per token from GenAI's record."""
    import numpy as np
    import tiny_lm

    from autotune.backends.generation import Generator, prepare

    torch.manual_seed(0)
    model = tiny_lm.tiny_llama().eval()
    options = {"kv_cache_precision": "f32", "dynamic_quantization_group_size": 0}
    config = TrialConfig("openvino", "fp32", batch_size=3, threads_per_instance=1, options=options)
    engine, details = prepare(model, config, 6)
    assert details["weight_types"] == {"f32": 15}  # 2 layers x 7 projections and the output layer
    assert details["drift_request_runtime"]["KV_CACHE_PRECISION"] == "f32"
    ids = torch.randint(0, 256, (3, 100), generator=torch.Generator().manual_seed(1))
    reference = Generator(model, 6)
    greedy, expected = reference.generate_with_logits(ids, 16)
    tokens, logits = engine.generate_with_logits(ids, 16, forced=greedy)
    assert torch.equal(tokens, greedy)  # fed FP32's tokens, it predicts them
    assert logits.shape == expected.shape == (3, 16 + 5, 256)
    assert float((logits - expected).norm() / expected.norm()) < 1e-4
    greedy_tokens = reference.generate(ids, stamp=False)
    assert torch.equal(engine.generate(ids, stamp=False), greedy_tokens)  # GenAI's pipeline
    assert torch.equal(engine.decode_steps(ids), greedy_tokens)  # the drift pass's infer request
    engine.token_stamps = type(engine.token_stamps)("d")
    assert engine.sliced
    engine._request.reset_state()
    raw = engine._request.infer({**_feed(ids.numpy()), "logits_to_keep": np.array([1], np.int64)})["logits"]
    assert raw.shape == (3, 1, 256)  # the IR's own output: one position, not the prompt's 100
    import time

    started = time.monotonic()
    engine.generate(ids)
    assert engine._request is None  # the timed calls run without the drift pass's copy of the weights
    stamps = list(engine.token_stamps)
    assert len(stamps) == 6 and stamps == sorted(stamps)
    assert started < stamps[0] and stamps[-1] < time.monotonic()  # GenAI's clock is autotune's


def _feed(ids):
    import numpy as np

    sequences, tokens = ids.shape
    return {
        "input_ids": ids,
        "attention_mask": np.ones((sequences, tokens), np.int64),
        "position_ids": np.tile(np.arange(tokens, dtype=np.int64), (sequences, 1)),
        "beam_idx": np.arange(sequences, dtype=np.int32),
    }


def test_a_trained_models_int8_keeps_perplexity_its_ir_is_exported_once_and_int4_runs_in_int4(
    searcher, workdir, trained
):
    """NNCF int8 within 2% perplexity, its tokens timed like any backend's (TTFT + (n-1) x TPOT is the
    call, less GenAI's return after the last token), the IR exported once per weight format and loaded by
    the other trials; int4 (group 32) says what ran: the projections in int4, the output layer in int8."""
    space = generation_space(
        workdir / "space.yaml",
        {
            "openvino": {
                "precision": ["int8_asym", "int4_sym"],
                "group_size": [32],
                "ratio": [1.0],
                "kv_cache_precision": ["u8", "f16"],
            }
        },
        sequences=(2, 1),
        allocators=("tcmalloc",),  # preloaded: OpenVINO's oneTBB needs its DEEPBIND off (or compile aborts)
    )
    result = searcher.generate(space=space, trials=4, trained=trained)
    assert_trials_ran(result)
    study = load_study(workdir, "tiny_llama")
    trials = [t for t in study.trials if t.user_attrs.get("config", {}).get("backend") == "openvino"]
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert {t.user_attrs["config"]["precision"] for t in done} == {"int8_asym", "int4_sym"}, [
        (t.state.name, t.user_attrs.get("fail_cause"), t.user_attrs.get("prune_reason")) for t in trials
    ]
    assert {t.user_attrs["config"]["allocator"] for t in done} == {"tcmalloc"}
    counts = {"int8_asym": {"int8": 15}, "int4_sym": {"int4": 14, "int8": 1}}
    for trial in done:
        metrics = TrialMetrics.from_trial_attrs(trial.user_attrs)
        drift, generation = metrics.drift, metrics.generation
        assert drift is not None and generation is not None
        if trial.user_attrs["config"]["precision"] == "int8_asym":
            assert drift.perplexity_increase <= 0.02, drift
        # the tokens' stamps account for the call, up to GenAI's return after its last token (assembling
        # the results and their metrics: 0.24 ms of a 4.5 ms call measured here, whatever the model's size)
        from_tokens = generation.ttft_ms.mean + (generation.new_tokens - 1) * generation.tpot_ms.mean
        tail_ms = metrics.latency_ms.mean - from_tokens
        # (means over the window's calls and over their tokens: not one sample set, so not exact at 0)
        assert -0.05 * metrics.latency_ms.mean <= tail_ms <= max(0.05 * metrics.latency_ms.mean, 0.5), tail_ms
        executed = trial.user_attrs["executed_precision"]
        assert executed["status"] == "ok" and executed["counts"] == counts[trial.user_attrs["config"]["precision"]]
    irs = sorted((workdir / "studies" / ".cache").glob("artifacts/openvino-*/openvino_model.xml"))
    assert len(irs) == 2, irs  # one per weight format, whatever the KV cache and sequences
    cached = [t.user_attrs["artifact"]["cached"] for t in done]
    assert cached.count(False) == 2 and len(cached) - 2 == cached.count(True), cached


def test_a_bf16_hint_is_refused_where_the_cpu_has_no_bf16():
    """The CPU plugin compiles a bf16 hint as f32 on a CPU without bf16 instructions: such a trial would
    repeat the f32 one, so it is refused before launch, with the plugin's own capabilities as the reason."""
    from autotune.backends.openvino import generate as engine
    from autotune.machine.probe import probe_machine

    isa = probe_machine().isa
    has_bf16 = bool(isa.get("avx512_bf16") or isa.get("amx_bf16"))
    bf16 = TrialConfig("openvino", "int8_asym", 1, options={"inference_precision": "bf16"})
    f32 = TrialConfig("openvino", "int8_asym", 1, options={"inference_precision": "f32"})
    refusal = engine.unsupported(bf16)
    assert (refusal is None) == has_bf16, (refusal, isa)
    assert engine.unsupported(f32) is None
    if refusal:
        assert "offers no bf16" in refusal and "FP32" in refusal


def test_genais_scheduler_cap_split_fuse_and_kv_groups_reach_the_pipeline_and_keep_its_tokens(tmp_path):
    """The settings OpenVINO GenAI exposes and autotune did not search: a cap on the tokens one step
    computes (here under the batch's 3 x 100 prompt tokens, so the prefill takes several steps), with
    split-fuse on and off, and the u8 KV cache's groups. Each reaches the pipeline (the trial's details say so,
    the drift request compiled with the groups) and decodes the same greedy tokens on an fp32 IR; the
    combinations that would repeat another trial are refused. A timed call stamps each of its new tokens
    once: the step at which every sequence had it."""
    import tiny_lm

    from autotune.backends import backend_module
    from autotune.backends.generation import prepare

    torch.manual_seed(0)
    model = tiny_lm.tiny_llama().eval()
    ids = torch.randint(0, 256, (3, 100), generator=torch.Generator().manual_seed(1))
    module = backend_module("openvino", "generate")
    unsupported = module.unsupported
    exported = module.build_artifact(model, None, TrialConfig("openvino", "fp32", batch_size=3), tmp_path)
    artifact = {"dir": str(tmp_path), "details": exported}  # exported once, as the prepare step does
    plain = {"kv_cache_precision": "f32", "dynamic_quantization_group_size": 0}
    tokens = []
    for options in (
        plain,
        {**plain, "max_num_batched_tokens": 128, "dynamic_split_fuse": True},
        {**plain, "max_num_batched_tokens": 128, "dynamic_split_fuse": False},
        {"kv_cache_precision": "u8", "kv_cache_group_size": 16, "dynamic_quantization_group_size": 0},
    ):
        config = TrialConfig("openvino", "fp32", batch_size=3, threads_per_instance=1, options=options)
        assert unsupported(config) is None
        engine, details = prepare(model, config, 6, artifact=artifact)
        cap = options.get("max_num_batched_tokens")
        assert details["scheduler"]["max_num_batched_tokens"] == cap
        assert details["scheduler"]["dynamic_split_fuse"] == options.get("dynamic_split_fuse", True)
        runtime = details["drift_request_runtime"]  # what the plugin compiled with the same properties
        groups = str(options.get("kv_cache_group_size", 0))
        assert (runtime["KEY_CACHE_GROUP_SIZE"], runtime["VALUE_CACHE_GROUP_SIZE"]) == (groups, groups), runtime
        tokens.append(engine.generate(ids))
        # one stamp per token of every sequence, in order, though a capped prefill staggers their first tokens
        stamps = list(engine.token_stamps)
        assert len(stamps) == 6 and stamps == sorted(stamps), stamps
    assert all(torch.equal(tokens[0], other) for other in tokens[1:3])  # scheduling only: the same tokens
    assert (tokens[3] == tokens[0]).float().mean() > 0.8  # a u8 cache in groups of 16 (the tiny heads): nearly the same
    refuse = [
        {"kv_cache_precision": "f16", "kv_cache_group_size": 32},
        {"max_num_batched_tokens": 0, "dynamic_split_fuse": False},
    ]
    for options in refuse:
        assert unsupported(TrialConfig("openvino", "fp32", batch_size=3, options=options)) is not None


CRASH_PROBE = """
import os, sys
import numpy as np, openvino as ov, openvino_genai
cpus = {int(c) for c in sys.argv[2].split(",")}
os.sched_setaffinity(0, cpus)
pipe = openvino_genai.LLMPipeline(sys.argv[1], "CPU", INFERENCE_NUM_THREADS=len(cpus), INFERENCE_PRECISION_HINT="bf16")
config = openvino_genai.GenerationConfig()
config.max_new_tokens = 2
config.ignore_eos = True
ids = np.ones((1, 8), np.int64)
pipe.generate(openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config)
"""


def test_fp16_weights_with_bf16_activations_on_one_cpu_are_refused_while_genai_dies_of_them(tmp_path):
    """On a CPU with AMX, OpenVINO GenAI's pipeline dies of SIGFPE compiling an fp16 IR with bf16 activations
    on one thread (a one-thread instance, pinned to one CPU), and runs on two; on one with bf16 but no AMX
    (Zen 4) it runs on one. The refusal is as narrow as the crash, which this test runs, so a release that
    fixes it, or a CPU where it happens without AMX, fails here."""
    import os
    import signal
    import subprocess
    import sys

    import tiny_lm

    from autotune.backends import backend_module

    module = backend_module("openvino", "generate")
    one = TrialConfig("openvino", "fp16", 1, threads_per_instance=1, options={"inference_precision": "bf16"})
    two = TrialConfig("openvino", "fp16", 1, threads_per_instance=2, options={"inference_precision": "bf16"})
    if "BF16" not in module.plugin_capabilities():  # bf16 is refused whatever the weights, for its own reason
        assert "offers no bf16" in (module.unsupported(one) or "")
        return
    amx = bf16_tiles()
    assert module.unsupported(one) == (module.FP16_BF16_ONE_CPU if amx else None)
    assert module.unsupported(two) is None
    assert (
        module.unsupported(
            TrialConfig("openvino", "int8_asym", 1, threads_per_instance=1, options={"inference_precision": "bf16"})
        )
        is None
    )
    torch.manual_seed(0)
    module.build_artifact(tiny_lm.tiny_llama().eval(), None, TrialConfig("openvino", "fp16", 1), tmp_path)
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, cpus  # CI's machines have two cores at least

    def probe(allowed: list[int]) -> subprocess.CompletedProcess:
        joined = ",".join(map(str, allowed))
        return subprocess.run(
            [sys.executable, "-c", CRASH_PROBE, str(tmp_path), joined], capture_output=True, timeout=300
        )

    assert probe(cpus[:1]).returncode == (-signal.SIGFPE if amx else 0)
    assert probe(cpus[:2]).returncode == 0

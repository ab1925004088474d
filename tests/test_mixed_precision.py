"""Mixed precision: the least sensitive matrices in the low type, the rest in the type above it
(`compressed_share`), ranked by generation/sensitivity.py, written by each engine's own mechanism and measured
by the real engine."""

from __future__ import annotations

import itertools
import random
import types
from typing import Any

import numpy as np
import pytest
import torch
from conftest import LM

from autotune.backends.generation.sensitivity import FORMATS, fake_quantize, rank_layers
from autotune.backends.llamacpp import gguf_export
from autotune.backends.llamacpp.generate import LlamaCppGenerator
from autotune.measure.drift import mean_kl_divergence
from autotune.model.sources import build_model, resolve_model

PROMPT, COMPARED = 64, 48
BOUND = 2e-4  # KL divergence: the tiny Llama's whole-model Q4_0 breaks it, Q8_0 keeps it


def held_out_windows(text_file, count: int, seed: int) -> torch.Tensor:
    """`count` seeded windows of PROMPT bytes of the tiny Llama's held-out text (its tokens are bytes)."""
    data = torch.tensor(list(text_file.read_bytes()), dtype=torch.long)
    starts = torch.randint(0, len(data) - PROMPT, (count,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([data[s : s + PROMPT] for s in starts.tolist()])


def trained_model(trained) -> torch.nn.Module:
    source = resolve_model(f"{LM}:tiny_llama", str(trained["weights"]), f"input_ids:int64:{PROMPT}:0-256")
    return build_model(source).eval()


def gguf_kld(model, mix: gguf_export.Mix, prompts: torch.Tensor, reference: np.ndarray, path) -> float:
    """Mean KL divergence of a Q4_0 GGUF holding `mix` from FP32 eager's logits, run by llama.cpp."""
    gguf_export.convert(model, "Q4_0", path, mix)
    generator = LlamaCppGenerator(path, new_tokens=1, threads=1)
    try:
        _, logits = generator.generate_with_logits(prompts, COMPARED)
    finally:
        generator.close()
    return mean_kl_divergence(logits.numpy().reshape(-1, 256), reference)


def test_the_least_sensitive_layers_compressed_drift_less_than_as_many_random_ones(trained, workdir):
    """On the trained tiny Llama, ranked on calibration windows and measured by llama.cpp on other windows: Q4_0
    on the least sensitive half of the weights (the rest Q8_0) drifts less from FP32 than Q4_0 on each of three
    random halves, and less than on the most sensitive half; the ranking sorts by score."""
    model = trained_model(trained)
    ranking = rank_layers(model, held_out_windows(trained["text"], 4, seed=1), "Q4_0")
    scores = [layer.score for layer in ranking.layers]
    assert scores == sorted(scores) and scores[0] < scores[-1]
    names = [layer.name for layer in ranking.layers]
    assert len(names) == 7 * model.config.num_hidden_layers  # q, k, v, o, gate, up, down per block; no lm_head

    prompts = held_out_windows(trained["text"], 8, seed=2)
    with torch.inference_mode():
        reference = model(prompts).logits[:, -COMPARED:].reshape(-1, 256).numpy()
    compressed = ranking.compressed(0.5)
    parameters = {layer.name: layer.parameters for layer in ranking.layers}
    half = sum(parameters[name] for name in compressed)
    assert 0.5 * sum(parameters.values()) <= half < 0.5 * sum(parameters.values()) + max(parameters.values())

    def kept_for(chosen: list[str] | tuple[str, ...]) -> tuple[str, ...]:
        return tuple(name for name in names if name not in set(chosen))

    ranked = gguf_kld(model, gguf_export.Mix(ranking.kept(0.5), "Q8_0"), prompts, reference, workdir / "ranked.gguf")
    worst = gguf_kld(
        model,
        gguf_export.Mix(kept_for(names[::-1][: len(compressed)]), "Q8_0"),
        prompts,
        reference,
        workdir / "worst.gguf",
    )
    randoms = []
    for seed in range(3):
        shuffled = names[:]
        random.Random(seed).shuffle(shuffled)
        chosen: list[str] = []
        for name in shuffled:  # as many parameters as the ranked half, or the first past it
            if sum(parameters[n] for n in chosen) >= half:
                break
            chosen.append(name)
        randoms.append(
            gguf_kld(
                model, gguf_export.Mix(kept_for(chosen), "Q8_0"), prompts, reference, workdir / f"random-{seed}.gguf"
            )
        )
    assert ranked < min(randoms) and ranked < worst, (ranked, randoms, worst)


def test_fake_quantization_keeps_the_types_grid():
    """The rounding the ranking models: Q4_0 holds at most 16 levels per block of 32, symmetric about zero;
    an asymmetric type keeps each block's minimum and maximum; int8 per row holds at most 256 levels."""
    weight = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    q4 = fake_quantize(weight, FORMATS["Q4_0"]).reshape(8, 2, 32)
    assert max(len(torch.unique(block)) for block in q4.reshape(-1, 32)) <= 16
    assert not torch.equal(q4.reshape(8, 64), weight)
    k4 = fake_quantize(weight, FORMATS["Q4_K_M"]).reshape(-1, 32)
    blocks = weight.reshape(-1, 32)
    assert torch.allclose(k4.min(dim=1).values, blocks.min(dim=1).values, atol=1e-6)
    assert torch.allclose(k4.max(dim=1).values, blocks.max(dim=1).values, atol=1e-5)
    q8 = fake_quantize(weight, FORMATS["int8_asym"])
    assert max(len(torch.unique(row)) for row in q8) <= 256
    assert (q8 - weight).abs().max() < (q4.reshape(8, 64) - weight).abs().max()


@pytest.mark.parametrize("factory", ["tiny_llama", "tiny_gpt2"])
def test_the_ranking_replays_the_blocks_before_a_matrix_and_scores_as_the_full_forward_does(factory):
    """rank_layers reuses the unrounded outputs of the blocks before a matrix's block: each score equals the
    one a full FP32 forward with that matrix alone rounded gives (a replay that fed a stale or a wrong block's
    output would move the scores of every matrix past the first block)."""
    import tiny_lm

    from autotune.backends.generation.sensitivity import ranked_linears

    torch.manual_seed(0)
    model = getattr(tiny_lm, factory)()
    config = model.config
    config.num_hidden_layers = 4  # replayed outputs of more than one block (GPT-2 reads n_layer through it)
    model = type(model)(config).eval()
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))
    ranking = rank_layers(model, ids, "Q4_0")
    with torch.inference_mode():
        reference = torch.log_softmax(model(ids).logits[:, -48:].reshape(-1, 256).double(), dim=-1)
    full = {}
    for name, module in ranked_linears(model).items():
        weight = module.weight.data
        conv = type(module).__name__ == "Conv1D"
        module.weight.data = fake_quantize(weight.t() if conv else weight, FORMATS["Q4_0"])
        module.weight.data = module.weight.data.t().contiguous() if conv else module.weight.data
        with torch.inference_mode():
            candidate = torch.log_softmax(model(ids).logits[:, -48:].reshape(-1, 256).double(), dim=-1)
        module.weight.data = weight
        full[name] = mean_kl_divergence(candidate.numpy(), reference.numpy())  # log-probabilities: their own logits
    assert len(ranking.layers) == len(full) > 4 and ranking.measured_s > 0  # its cost, kept with it
    scores = {layer.name: layer.score for layer in ranking.layers}
    assert min(full.values()) > 0
    for name, score in full.items():
        assert scores[name] == pytest.approx(score, rel=1e-3), name


class SharedBlocks(torch.nn.Module):
    """A decoder-shaped model that calls its blocks in `order`; (0, 1, 2, 1) calls block 1 twice (shared
    weights, as ALBERT's): a replay of the blocks before a matrix's block would hand block 1's second call
    its first output."""

    def __init__(self, order: tuple[int, ...] = (0, 1, 2, 1)) -> None:
        super().__init__()
        self.order = order
        self.embed = torch.nn.Embedding(256, 16)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for _ in range(3)
        )
        self.head = torch.nn.Linear(16, 256)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, input_ids: torch.Tensor) -> Any:
        hidden = self.embed(input_ids)
        for index in self.order:
            hidden = hidden + self.blocks[index](hidden)
        return types.SimpleNamespace(logits=self.head(hidden))


def full_forward_scores(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, float]:
    """Each ranked matrix's score from a full forward with it alone rounded to Q4_0 (no replay)."""
    from autotune.backends.generation.sensitivity import ranked_linears

    with torch.inference_mode():
        reference = torch.log_softmax(model(ids).logits.reshape(-1, 256).double(), dim=-1)
    scores = {}
    for name, module in ranked_linears(model).items():
        weight = module.weight.data
        module.weight.data = fake_quantize(weight, FORMATS["Q4_0"])
        with torch.inference_mode():
            candidate = torch.log_softmax(model(ids).logits.reshape(-1, 256).double(), dim=-1)
        module.weight.data = weight
        scores[name] = mean_kl_divergence(candidate.numpy(), reference.numpy())
    return scores


def test_blocks_called_out_of_order_or_with_their_own_forward_are_not_replayed():
    """A model calling a block twice is ranked by full forwards (its scores equal theirs). A model calling its
    blocks in order whose block 0 has its own forward (a hook library's wrapper, here one that doubles the
    block's output) is not replayed either: a replay would replace the wrapper (its scores would follow the
    unwrapped block) and delete it after; it keeps its wrapper and the wrapped model's scores."""
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    shared = SharedBlocks().eval()
    expected = full_forward_scores(shared, ids)
    scores = {layer.name: layer.score for layer in rank_layers(shared, ids, "Q4_0").layers}
    assert set(scores) == {"blocks.0.0", "blocks.1.0", "blocks.2.0"}
    for name, score in expected.items():
        assert scores[name] == pytest.approx(score, rel=1e-3), name

    torch.manual_seed(0)
    in_order = SharedBlocks((0, 1, 2)).eval()
    block = in_order.blocks[0]
    unwrapped = block.forward

    def wrapper(hidden: torch.Tensor) -> torch.Tensor:
        return 2 * unwrapped(hidden)

    block.forward = wrapper
    expected = full_forward_scores(in_order, ids)
    scores = {layer.name: layer.score for layer in rank_layers(in_order, ids, "Q4_0").layers}
    for name, score in expected.items():
        assert scores[name] == pytest.approx(score, rel=1e-3), name
    assert vars(block)["forward"] is wrapper


@pytest.mark.parametrize(
    ("share", "compressed", "kept"),
    [
        (0.0, (), ("l3", "l2", "l1", "l0")),
        (0.25, ("l0", "l1"), ("l3", "l2")),  # l0's 100 of 500 fall short of 125: l1, the first past it, goes too
        (0.3, ("l0", "l1"), ("l3", "l2")),  # exactly 150: no more
        (1.0, ("l0", "l1", "l2", "l3"), ()),
    ],
)
def test_a_share_compresses_the_least_sensitive_weights_counted_by_parameters(share, compressed, kept):
    """`compressed(share)` takes the least sensitive layers until their parameters reach the share (the first
    past it included, as NNCF's ratio counts); `kept` is the rest, most sensitive first."""
    from autotune.backends.generation.sensitivity import LayerSensitivity, Sensitivity

    layers = tuple(LayerSensitivity(f"l{i}", p, float(i)) for i, p in enumerate((100, 50, 200, 150)))
    ranking = Sensitivity("Q4_0", "test", layers)
    assert ranking.compressed(share) == compressed
    assert ranking.kept(share) == kept
    with pytest.raises(ValueError, match="compressed_share"):
        ranking.compressed(1.5)


def engine_trials(trained, workdir, runs: dict[str, tuple], options: dict | None = None) -> dict:
    """Real trials of the trained tiny Llama (prompt PROMPT, 4 new tokens, drift over 8 prompts), one per
    name: (backend, precision, compressed_share or None for the whole-model type[, that run's own options])."""
    from autotune.machine.probe import probe_machine
    from autotune.measure.stopwatch import MeasureSettings
    from autotune.model.generation import GenerationWorkload
    from autotune.records.config import TrialConfig
    from autotune.runner.trials import TrialContext, compute_reference, run_config

    source = resolve_model(f"{LM}:tiny_llama", str(trained["weights"]), f"input_ids:int64:{PROMPT}:0-256")
    workload = GenerationWorkload(PROMPT, 4, 256, 256, str(trained["text"]))
    reference = compute_reference(source, workdir / "study", 8, 300, generation=workload)
    measure = MeasureSettings(warmup_min_s=0.1, window_min_s=0.2, window_max_s=0.5, screen_s=0.0)
    ctx = TrialContext(probe_machine(), reference, measure, workdir / ".cache", noisy_retries=0)
    done = {}
    for name, (backend, precision, share, *own) in runs.items():
        chosen = {
            **(options or {}),
            **(own[0] if own else {}),
            **({} if share is None else {"compressed_share": share}),
        }
        config = TrialConfig(backend, precision, 1, threads_per_instance=2, options=chosen)
        done[name] = run_config(config, ctx, workdir / name, 600)[0]
    return done


def assert_mix_spans_its_types(runs: dict, types_key: str, kept_bucket_type: str, low_type: str) -> None:
    """mix0 drifts as `higher`, mix100 is `lower` (the same artifact), mix50 lies between and holds exactly
    the mix asked, named: its matrices by type as the build read them off the file (`types_key`), or, for
    torchao's modules (None), as the executed-precision check counted them."""
    kld = {name: metrics.drift.kl_divergence for name, metrics in runs.items()}
    assert kld["mix0"] == pytest.approx(kld["higher"], rel=0.05, abs=1e-6), kld
    assert runs["mix100"].artifact.dir == runs["lower"].artifact.dir and kld["mix100"] == kld["lower"]
    assert kld["mix0"] < kld["mix50"] < kld["mix100"], kld
    details = runs["mix50"].backend_details
    ranked = len(details["sensitivity"]["layers"])
    assert details["compressed_share"] == 0.5
    kept = details["kept_layers"]
    assert 0 < len(kept) < ranked and details["compressed_layers"] == ranked - len(kept)

    def held(metrics) -> dict:
        if types_key is not None:
            return metrics.backend_details[types_key]
        return metrics.executed_precision.counts

    assert held(runs["mix50"]) == {kept_bucket_type: len(kept) + 1, low_type: ranked - len(kept)}  # + the output
    assert runs["mix50"].executed_precision.status == "ok", runs["mix50"].executed_precision
    assert held(runs["mix0"]) == {kept_bucket_type: ranked + 1}


@pytest.mark.slow
def test_llamacpp_mixes_run_from_the_higher_types_drift_to_the_lower_types_with_the_mix_asked(trained, workdir):
    """Real llama.cpp trials of the trained tiny Llama: a Q4_0 mix at share 0 holds every matrix in Q8_0 and
    drifts as the Q8_0 file does; at share 1 it is the Q4_0 file (the same artifact); between, the drift lies
    between, and the file holds exactly the mix asked (kept matrices and the output in Q8_0, the compressed
    ones in Q4_0), with the kept layers named. The ranking is measured once for every share."""
    shares = {"mix0": 0.0, "mix50": 0.5, "mix100": 1.0}
    runs = engine_trials(
        trained,
        workdir,
        {
            "higher": ("llamacpp", "Q8_0", None),
            "lower": ("llamacpp", "Q4_0", None),
            **{name: ("llamacpp", "Q4_0", share) for name, share in shares.items()},
        },
    )
    assert_mix_spans_its_types(runs, "tensor_types", "Q8_0", "Q4_0")
    assert runs["mix50"].backend_details["kept_type"] == "Q8_0"
    assert len(list((workdir / ".cache" / "sensitivity").glob("Q4_0-*.json"))) == 1


@pytest.mark.slow
def test_openvino_mixes_run_from_fp16s_drift_to_int8s_with_the_mix_asked(trained, workdir):
    """Real OpenVINO GenAI trials of the trained tiny Llama: an int8_asym mix (NNCF with the kept matrices
    as its ignored scope) at share 0 holds every matrix in fp16 and drifts as the fp16 IR; at share 1 it is
    optimum-cli's int8 IR; between, the drift lies between and the IR holds exactly the mix asked (kept
    matrices and the output in f16, the others in u8)."""
    shares = {"mix0": 0.0, "mix50": 0.5, "mix100": 1.0}
    runs = engine_trials(
        trained,
        workdir,
        {
            "higher": ("openvino", "fp16", None),
            "lower": ("openvino", "int8_asym", None),
            **{name: ("openvino", "int8_asym", share) for name, share in shares.items()},
        },
    )
    assert_mix_spans_its_types(runs, "weight_types", "f16", "u8")
    assert runs["mix50"].backend_details["kept_type"] == "fp16"


@pytest.mark.parametrize(
    ("backend", "low", "wide"),
    [("llamacpp", "Q4_0", "F32"), ("openvino", "int8_asym", "fp16"), ("eager", "woq_int4", "smoothquant_int8")],
)
def test_a_mix_of_a_type_the_engine_does_not_mix_or_a_share_outside_0_1_is_refused(backend, low, wide):
    """compressed_share mixes one of the engine's low types with a wider one: at a type it does not mix (which
    would pay for a ranking and change nothing), or beyond [0, 1], the trial is refused before it runs, in
    words."""
    from autotune.backends import backend_module
    from autotune.records.config import TrialConfig

    unsupported = backend_module(backend, "generate").unsupported

    def why(precision: str, share: float) -> str | None:
        return unsupported(TrialConfig(backend, precision, 1, options={"compressed_share": share}))

    assert f"{wide} is not one" in str(why(wide, 0.5))
    assert "[0, 1]" in str(why(low, 1.5))
    assert why(low, 0.5) is None and why(wide, 1.0) is None


@pytest.mark.slow
def test_the_search_bisects_for_the_largest_share_within_the_bound(trained, searcher, workdir):
    """A search of llama.cpp Q4_0 on the trained tiny Llama, whose whole-model Q4_0 breaks a KL divergence bound
    that Q8_0 keeps: the sampler never draws a share; once share 1 is pruned for drift, the mix search
    enqueues 0.5, then bisects (0.75 or 0.25, ...) and finds a mix within the bound in at most 3 more trials,
    each a real trial whose drift decides the next; the winner is that mix, its kept layers in best.json, and
    the report draws its matrices by sensitivity."""
    import json

    from conftest import QUICK_GENERATION, assert_trials_ran, flagged_noisy, generation_space, load_study

    from autotune.records.attributes import Attr, TrialAttrs

    shares = [1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0]
    space = generation_space(
        workdir / "mix.yaml",
        {"llamacpp": {"precision": ["Q4_0"], "compressed_share": shares}},  # no baseline: the winner is a mix
        sequences=(1,),
    )
    model = ["--model", f"{LM}:tiny_llama", "--weights", str(trained["weights"]), "--data", str(trained["text"])]
    shape = ["--prompt-tokens", str(PROMPT), "--new-tokens", "4", "--eval-samples", "8", "--finalists", "0"]
    bound = ["--drift-metric", "kld", "--max-drift", str(BOUND)]
    result = searcher(
        "search",
        *model,
        "--space",
        str(space),
        *shape,
        *bound,
        *QUICK_GENERATION,
        "--study",
        "mix",
        "--trials",
        "5",
        timeout=900,
    )
    assert_trials_ran(result)
    trials = [t for t in load_study(workdir, "mix").trials if t.params.get("backend") == "llamacpp"]
    first = trials[0]
    assert (TrialAttrs.of(first).prune_reason or "").startswith("drift:"), TrialAttrs.of(first).prune_reason
    guided = [t for t in trials if Attr.MIX_SHARE in t.user_attrs]
    sampled = [t for t in trials if Attr.MIX_SHARE not in t.user_attrs]
    assert all("llamacpp.compressed_share" not in t.params for t in sampled)  # the whole-model file
    assert 1 <= len(guided) <= 3 and guided[0].params["llamacpp.compressed_share"] == 0.5
    for before, after in itertools.pairwise(guided):  # each share halves the interval the one before left
        step = abs(after.params["llamacpp.compressed_share"] - before.params["llamacpp.compressed_share"])
        assert step == pytest.approx(0.5 / 2 ** guided.index(after)), [t.params for t in guided]
    within = [t for t in guided if t.state.name == "COMPLETE"]
    assert within, [(t.params, TrialAttrs.of(t).prune_reason) for t in guided]
    if flagged_noisy(result):  # a loaded machine flagged the mix's only timing: no winner to export
        return
    best = json.loads((workdir / "studies" / "mix" / "best.json").read_text())
    assert best["config"]["backend"] == "llamacpp", best["config"]
    share = best["config"]["options"]["compressed_share"]
    assert share == max(t.params["llamacpp.compressed_share"] for t in within)
    report = searcher("report", "--study", "mix")
    assert report.returncode == 0, report.stderr
    page = (workdir / "studies" / "mix" / "report.html").read_text()
    assert "Sensitivity of each matrix to the low type" in page and "the front a step line" in page
    assert all(name in page for name in best["mix"]["kept_layers"])  # the chart names every matrix
    mix = best["mix"]
    assert best["config"]["precision"] == mix["low_type"] == "Q4_0" and mix["compressed_share"] == share
    assert mix["kept_layers"] and mix["executed"] == {
        "Q8_0": len(mix["kept_layers"]) + 1,
        "Q4_0": mix["compressed_layers"],
    }


@pytest.mark.slow
def test_torchao_mixes_run_from_int8s_drift_to_int4s_with_the_mix_asked(trained, workdir):
    """Real eager trials of the trained tiny Llama at torchao's woq_int4 (bf16 activations, groups of 32): a mix
    at share 0 holds every Linear in woq_int8 and drifts as woq_int8 does; at share 1 it is woq_int4 (the same
    artifact); between, the drift lies between and the model holds exactly the mix asked (kept matrices and
    the output layer in int8, the others in int4, torchao's filter_fn choosing them)."""
    runs = engine_trials(
        trained,
        workdir,
        {
            "higher": ("eager", "woq_int8", None),
            "lower": ("eager", "woq_int4", None),
            **{name: ("eager", "woq_int4", share) for name, share in (("mix0", 0.0), ("mix50", 0.5), ("mix100", 1.0))},
        },
        {"activations": "bf16", "group_size": 32},
    )
    assert_mix_spans_its_types(runs, None, "int8", "int4")
    assert runs["mix50"].backend_details["kept_type"] == "woq_int8"


def test_llamacpps_importance_matrix_from_the_calibration_text_lowers_q4_0s_drift(trained, workdir):
    """Real llama.cpp trials of the trained tiny Llama: Q4_0 quantized with an importance matrix (each Linear's
    mean squared input per column over the calibration text, llama-imatrix's E[x^2]) drifts less from FP32
    than Q4_0 without one (measured: 13% less KLD), and says so in its build; Q8_0, which has one rounding only,
    refuses it."""
    from autotune.backends.llamacpp.generate import unsupported
    from autotune.records.config import TrialConfig

    runs = engine_trials(
        trained,
        workdir,
        {"plain": ("llamacpp", "Q4_0", None), "imatrix": ("llamacpp", "Q4_0", None, {"imatrix": True})},
    )
    assert "imatrix" not in runs["plain"].backend_details
    assert runs["imatrix"].backend_details["imatrix"].startswith("E[x^2] per input column")
    kld = {name: metrics.drift.kl_divergence for name, metrics in runs.items()}
    assert kld["imatrix"] < kld["plain"], kld
    refused = unsupported(TrialConfig("llamacpp", "Q8_0", 1, options={"imatrix": True}))
    assert refused is not None and "importance matrix" in refused


def test_nncfs_data_aware_int4_on_the_calibration_text_runs_in_openvino_genai(trained, workdir):
    """Real OpenVINO GenAI trials of the trained tiny Llama at int4_sym (groups of 32): NNCF's AWQ, scale
    estimation and GPTQ, each on the calibration text through the IR, write an IR that holds int4 as the plain
    export does and say which algorithm ran; the best of them drifts less than the plain export."""
    variants = ("awq", "scale_estimation", "gptq")
    runs = engine_trials(
        trained,
        workdir,
        {
            "none": ("openvino", "int4_sym", None),
            **{name: ("openvino", "int4_sym", None, {"data_aware": name}) for name in variants},
        },
        {"group_size": 32},
    )
    kld = {name: metrics.drift.kl_divergence for name, metrics in runs.items()}
    for name in variants:
        details = runs[name].backend_details
        assert f"{name} on 4 calibration rows" in details["exported_by"], details["exported_by"]
        assert details["weight_types"] == runs["none"].backend_details["weight_types"]
        assert runs[name].executed_precision.status == "ok"
    assert min(kld[name] for name in variants) < kld["none"], kld  # measured: GPTQ 0.00027 against 0.0011


@pytest.mark.slow
@pytest.mark.parametrize(("factory", "output"), [("tiny_gpt2", 1), ("tiny_llama_tied", 0)])
def test_a_mix_of_gpt2s_conv1d_projections_and_of_a_tied_output_layer_holds_what_was_asked(factory, output, workdir):
    """GPT-2's projections are transformers' Conv1D (a transposed Linear): ranked and mixed like any matrix. A
    model whose output layer is the token embedding has no output matrix in its GGUF: the mix's check does not
    count one. A real llama.cpp trial of each, random init, Q4_0 at share 0.5."""
    from autotune.machine.probe import probe_machine
    from autotune.measure.stopwatch import MeasureSettings
    from autotune.model.generation import GenerationWorkload
    from autotune.records.config import TrialConfig
    from autotune.runner.trials import TrialContext, compute_reference, run_config

    source = resolve_model(f"{LM}:{factory}", None, "input_ids:int64:32:0-256")
    workload = GenerationWorkload(32, 2, 256, 256)
    reference = compute_reference(source, workdir / "study", 2, 300, generation=workload)
    measure = MeasureSettings(warmup_min_s=0.1, window_min_s=0.2, window_max_s=0.5, screen_s=0.0)
    ctx = TrialContext(probe_machine(), reference, measure, workdir / ".cache", noisy_retries=0)
    config = TrialConfig("llamacpp", "Q4_0", 1, threads_per_instance=2, options={"compressed_share": 0.5})
    metrics = run_config(config, ctx, workdir / "trial", 600)[0]
    details = metrics.backend_details
    per_block = 4 if factory == "tiny_gpt2" else 7  # GPT-2: c_attn, attn.c_proj, c_fc, mlp.c_proj
    assert len(details["sensitivity"]["layers"]) == per_block * 2
    assert 0 < details["compressed_layers"] < len(details["sensitivity"]["layers"])
    assert details["output_matrices"] == output
    assert metrics.executed_precision.status == "ok", metrics.executed_precision

"""TrialConfig environments and pinning, and the search space on a real Optuna study."""

from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune.backends import BACKENDS
from autotune.common.errors import UserError
from autotune.machine.probe import JEMALLOC_CONF, MachineProbe, PhysicalCore
from autotune.machine.runtimes import Runtime
from autotune.records.attributes import Attr
from autotune.records.config import TrialConfig, clean_environment, pin_prefix
from autotune.tuning.space import InfeasibleConfig, SearchSpace


def described_runtime(name="main", role="main", lacks=("ipex",), openmp=("gnu", "intel")) -> Runtime:
    """A runtime as its probe would report it: every backend imports except `lacks`."""
    return Runtime(
        name,
        f"/envs/{name}/bin/python",
        role,
        torch="2.14.1",
        backends={b: (f"{b}: ModuleNotFoundError" if b in lacks else None) for b in BACKENDS},
        openmp={kind: f"/envs/{name}/lib/lib{kind}.so" for kind in openmp},
    )


RUNTIMES = {"main": described_runtime()}


def fake_machine(cores: int = 4, smt: int = 2, allocators=None, pinning="numactl", thp="madvise") -> MachineProbe:
    """A described machine (not this one) to test arithmetic for bigger hosts; cpus numbered non-contiguously."""
    phys = tuple(
        PhysicalCore(0, i, tuple(i + k * cores for k in range(smt)), numa_node=0 if i < cores // 2 else 1)
        for i in range(cores)
    )
    return MachineProbe(
        cpu_model="test",
        isa={},
        allowed_cpus=tuple(sorted(c for core in phys for c in core.cpus)),
        cores=phys,
        numa_nodes={0: (), 1: ()},
        allocators=allocators
        if allocators is not None
        else {"tcmalloc": "/x/libtcmalloc.so.4", "jemalloc": "/x/libjemalloc.so.2"},
        pinning=pinning,
        thp=thp,
    )


def test_env_per_allocator():
    machine = fake_machine()
    base = TrialConfig("eager", "fp32", 8, "glibc", 1, 3)
    assert base.to_env(machine) == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    tc = replace(base, allocator="tcmalloc").to_env(machine)
    assert tc["LD_PRELOAD"] == "/x/libtcmalloc.so.4" and "MALLOC_CONF" not in tc
    je = replace(base, allocator="jemalloc").to_env(machine)
    assert je["LD_PRELOAD"] == "/x/libjemalloc.so.2" and je["MALLOC_CONF"] == JEMALLOC_CONF
    with pytest.raises(ValueError):
        replace(base, allocator="jemalloc").to_env(fake_machine(allocators={}))


def test_instances_get_disjoint_physical_cores():
    machine = fake_machine(cores=4, smt=2)
    cpus = TrialConfig("eager", "fp32", 8, instances=2, threads_per_instance=2).instance_cpus(machine)
    assert cpus == [(0, 1), (2, 3)]  # first sibling of each core; siblings 4..7 left idle
    assert pin_prefix(cpus[1], machine) == ["numactl", "--physcpubind=2,3", "--membind=1"]
    assert pin_prefix(cpus[0], fake_machine(pinning="taskset")) == ["taskset", "-c", "0,1"]
    with pytest.raises(ValueError):
        TrialConfig("eager", "fp32", 8, instances=3, threads_per_instance=2).instance_cpus(machine)


def test_clean_environment_drops_managed_variables():
    env = clean_environment(
        {"PATH": "/bin", "LD_PRELOAD": "x", "OMP_NUM_THREADS": "9", "KMP_AFFINITY": "y", "MALLOC_CONF": "z"}
    )
    assert env == {"PATH": "/bin"}


def test_numerics_key_ignores_threads_and_allocator():
    a = TrialConfig("eager", "bf16", 8, "glibc", 1, 2, {"memory_format": "channels_last"})
    assert a.numerics_key() == replace(a, allocator="jemalloc", threads_per_instance=1, batch_size=4).numerics_key()
    assert a.numerics_key() != replace(a, precision="fp32").numerics_key()


SPACE = {
    "batch_size": [1, 8],
    "allocator": ["glibc", "tcmalloc", "jemalloc"],
    "backends": {"eager": {"precision": ["fp32", "bf16"]}, "inductor": {"freezing": [True, False]}},
}


def test_space_samples_only_valid_conditional_configs():
    machine = fake_machine(cores=8)
    space = SearchSpace.parse(SPACE, machine, RUNTIMES)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(60):
        trial = study.ask()
        config = space.suggest(trial)
        assert config.total_cores <= 8
        if config.backend == "eager":
            assert not any(k.startswith("inductor.") for k in trial.params)
        else:
            assert "freezing" in config.options and config.precision == "fp32"
        seen.add((config.backend, config.instances))
        study.tell(trial, 1.0)
    assert {b for b, _ in seen} == {"eager", "inductor"} and {i for _, i in seen} == {1, 2, 4, 8}


def test_an_earlier_winner_is_narrowed_to_the_values_the_space_offers():
    """What an earlier study's winner becomes in a narrower space: every value outside it (a batch size,
    the OpenMP pool, a runtime, the server's batching, another backend's option) left out, so Optuna
    samples it instead of raising on it; nothing of it at all when its backend is not offered."""
    space = SearchSpace.parse(SPACE, fake_machine(cores=8), RUNTIMES)
    winner = {
        "backend": "inductor",
        "inductor.precision": "fp32",
        "inductor.freezing": True,
        "batch_size": 32,
        "allocator": "glibc",
        "instances": 2,
        "threads_per_instance": 4,
        "openmp": "intel",
        "thp": True,
        "max_wait_ms": 5.0,
        "inductor.runtime": "ipex",
        "openvino.hint": "LATENCY",
    }
    params, dropped = space.offered_params(winner)
    assert dropped == [
        "batch_size=32",
        "openmp=intel",
        "thp=True",
        "max_wait_ms=5.0",
        "inductor.runtime=ipex",
        "openvino.hint=LATENCY",
    ]
    study = optuna.create_study()
    study.enqueue_trial(params)
    config = space.suggest(study.ask())  # raised ValueError on batch_size 32 when enqueued whole
    assert (config.backend, config.options["freezing"], config.instances, config.threads_per_instance) == (
        "inductor",
        True,
        2,
        4,
    )
    assert config.batch_size in (1, 8) and config.openmp == "gnu"
    assert space.offered_params({**winner, "backend": "openvino"})[0] == {}


def test_space_drops_missing_allocators_with_a_note():
    space = SearchSpace.parse(SPACE, fake_machine(allocators={"jemalloc": "/x/libjemalloc.so.2"}), RUNTIMES)
    assert space.allocators == ["glibc", "jemalloc"]
    assert any("tcmalloc" in note for note in space.notes)


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"batch_sizes": [1]}, "unknown key 'batch_sizes'"),
        ({"backends": {"tensorrt": {}}}, "unknown backend 'tensorrt'"),
        ({"backends": {"eager": {"precision": ["int4"]}}}, "int4"),
        ({"backends": {"eager": {"streams": [1]}}}, "no option 'streams'"),
        ({"instances": [16]}, "between 1 and the 8 physical cores"),
        ({"allocator": ["hoard"]}, "unknown allocator 'hoard'"),
        ({"batch_size": ["big"]}, "batch_size must be a list of int"),
    ],
)
def test_space_rejects_bad_values(bad, message):
    with pytest.raises(UserError, match=message):
        SearchSpace.parse({**SPACE, **bad}, fake_machine(cores=8), RUNTIMES)


def test_baseline_is_eager_fp32_on_all_cores():
    params = SearchSpace.parse(SPACE, fake_machine(cores=8), RUNTIMES).baseline_params()
    assert params == {
        "backend": "eager",
        "eager.precision": "fp32",
        "batch_size": 8,
        "allocator": "glibc",
        "instances": 1,
        "threads_per_instance": 8,
        "eager.memory_format": "contiguous",
        "openmp": "gnu",
        "thp": False,
    }


def test_explicit_thread_lists_never_launch_what_does_not_fit():
    space = SearchSpace.parse(
        {**SPACE, "instances": [1, 2], "threads_per_instance": [2, 4]}, fake_machine(cores=4), RUNTIMES
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    outcomes = set()
    for _ in range(40):
        trial = study.ask()
        try:
            config = space.suggest(trial)
        except InfeasibleConfig:
            outcomes.add("infeasible")
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        assert config.total_cores <= 4
        outcomes.add("fits")
        study.tell(trial, 1.0)
    assert outcomes == {"fits", "infeasible"}  # 2 instances x 4 threads was sampled and refused
    assert all(p["instances"] * p["threads_per_instance"] <= 4 for p in space.coverage_params())


def test_coverage_tries_every_backend_and_precision_once():
    pairs = {
        (p["backend"], p[f"{p['backend']}.precision"])
        for p in SearchSpace.parse(SPACE, fake_machine(cores=8), RUNTIMES).coverage_params()
    }
    assert pairs == {("eager", "fp32"), ("eager", "bf16"), ("inductor", "fp32")}


def test_baseline_batch_must_be_in_the_space():
    with pytest.raises(UserError, match="baseline batch_size 3"):
        SearchSpace.parse({**SPACE, "baseline": {"batch_size": 3}}, fake_machine(), RUNTIMES)
    with pytest.raises(UserError, match="'baseline' must be a mapping"):
        SearchSpace.parse({**SPACE, "baseline": 5}, fake_machine(), RUNTIMES)


def sample(space: SearchSpace, n: int, seed: int = 0) -> list[tuple[TrialConfig | None, dict]]:
    """Ask a real Optuna study n times; None where the space refused the combination."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask()
        try:
            config = space.suggest(trial)
        except InfeasibleConfig:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            out.append((None, trial.params))
            continue
        study.tell(trial, 1.0)
        out.append((config, trial.params))
    return out


ROUTED = {"backends": {"eager": {}, "ipex": {"precision": ["bf16"]}, "openvino": {}}, "batch_size": [8]}


def test_routing_sends_each_backend_to_a_runtime_that_imports_it():
    runtimes = {
        "main": described_runtime(),
        "ipex": described_runtime("ipex", "auto", lacks=("onnxruntime", "openvino")),
    }
    space = SearchSpace.parse(ROUTED, fake_machine(), runtimes)
    assert space.runtimes == {
        "eager": ["main"],
        "ipex": ["ipex"],
        "openvino": ["main"],
    }  # .venv-ipex only fills the gap
    for config, params in sample(space, 40):
        assert config.runtime == ("ipex" if config.backend == "ipex" else "main")
        assert not any(key.endswith(".runtime") for key in params)  # one choice: not a dimension


def test_an_explicit_runtime_competes_for_the_backends_it_runs():
    runtimes = {"main": described_runtime(), "t28": described_runtime("t28", "explicit", lacks=("ipex", "openvino"))}
    space = SearchSpace.parse(ROUTED | {"backends": {"eager": {}, "openvino": {}}}, fake_machine(), runtimes)
    assert space.runtimes == {"eager": ["main", "t28"], "openvino": ["main"]}
    seen = {(c.backend, c.runtime) for c, _ in sample(space, 60)}
    assert seen == {("eager", "main"), ("eager", "t28"), ("openvino", "main")}
    coverage = [(p["backend"], p.get("eager.runtime")) for p in space.coverage_params()]
    assert ("eager", "main") in coverage and ("eager", "t28") in coverage  # each runtime measured once early
    assert space.baseline_params()["eager.runtime"] == "main"


def test_a_backend_no_runtime_imports_is_left_out_with_the_reason():
    space = SearchSpace.parse(ROUTED, fake_machine(), {"main": described_runtime()})
    assert "ipex" not in space.backends
    assert any("ipex imports in no runtime" in note and "ModuleNotFoundError" in note for note in space.notes)
    with pytest.raises(UserError, match="none of the listed backends"):
        SearchSpace.parse({"backends": {"ipex": {}}}, fake_machine(), {"main": described_runtime()})


def test_an_explicit_runtime_that_runs_nothing_is_refused():
    runtimes = {"main": described_runtime(), "bare": described_runtime("bare", "explicit", lacks=tuple(BACKENDS))}
    with pytest.raises(UserError, match=r"runtime bare .* runs none of"):
        SearchSpace.parse(ROUTED, fake_machine(), runtimes)


def test_openmp_and_huge_pages_are_sampled_for_torch_backends_only():
    space = SearchSpace.parse(
        {**ROUTED, "openmp": ["gnu", "intel"], "kmp_blocktime": [0, 200], "thp": [False, True]},
        fake_machine(),
        {"main": described_runtime(lacks=())},
    )
    seen_openmp = set()
    for config, params in sample(space, 80):
        if config.backend == "openvino":  # its own thread pool (TBB): the settings would do nothing
            assert not {"openmp", "thp", "kmp_blocktime"} & set(params) and config.openmp == "gnu" and not config.thp
            continue
        seen_openmp.add(config.openmp)
        if config.openmp == "gnu":
            assert "kmp_blocktime" not in params and config.kmp_blocktime is None
        else:
            assert config.kmp_blocktime in (0, 200) and config.kmp_affinity == "granularity=fine,compact,1,0"
    assert seen_openmp == {"gnu", "intel"}


def test_openmp_and_thp_are_left_out_where_they_cannot_work():
    no_iomp = {"main": described_runtime(openmp=("gnu",))}
    space = SearchSpace.parse(
        {**ROUTED, "openmp": ["gnu", "intel"], "thp": [False, True]}, fake_machine(thp="always"), no_iomp
    )
    assert space.thread_pool.openmp == ["gnu"] and space.thread_pool.thp == [False]
    assert any("Intel OpenMP" in n for n in space.notes) and any("huge pages are 'always'" in n for n in space.notes)
    with pytest.raises(UserError, match="unknown openmp 'llvm'"):
        SearchSpace.parse({**ROUTED, "openmp": ["llvm"]}, fake_machine(), RUNTIMES)


def test_intel_openmp_is_preloaded_after_the_allocator_with_its_settings():
    config = TrialConfig(
        "eager", "fp32", 8, "tcmalloc", 1, 2, openmp="intel", kmp_affinity="disabled", kmp_blocktime=0, thp=True
    )
    env = config.to_env(fake_machine(), {"intel": "/envs/main/lib/libiomp5.so"})
    assert env["LD_PRELOAD"] == "/x/libtcmalloc.so.4:/envs/main/lib/libiomp5.so"
    assert (env["KMP_AFFINITY"], env["KMP_BLOCKTIME"], env["THP_MEM_ALLOC_ENABLE"]) == ("disabled", "0", "1")
    with pytest.raises(ValueError, match="Intel OpenMP"):
        config.to_env(fake_machine(), {"gnu": "/x/libgomp.so.1"})
    plain = TrialConfig("eager", "fp32", 8).to_env(fake_machine())
    assert not {"LD_PRELOAD", "KMP_AFFINITY", "THP_MEM_ALLOC_ENABLE"} & set(plain)


def test_the_runtime_is_part_of_the_numerics_key():
    a = TrialConfig("eager", "bf16", 8)
    assert a.numerics_key() != replace(a, runtime="ipex").numerics_key()
    assert a.numerics_key() == replace(a, openmp="intel", thp=True).numerics_key()


def test_ipex_with_intel_openmp_affinity_disabled_is_never_launched():
    runtimes = {"main": described_runtime(), "ipex": described_runtime("ipex", "auto", lacks=("openvino",))}
    space = SearchSpace.parse(
        {
            "backends": {"ipex": {}, "eager": {}},
            "batch_size": [8],
            "openmp": ["intel"],
            "kmp_affinity": ["granularity=fine,compact,1,0", "disabled"],
        },
        fake_machine(),
        runtimes,
    )
    refused = launched = 0
    for config, params in sample(space, 60):
        if config is None:
            assert params["backend"] == "ipex" and params["kmp_affinity"] == "disabled"
            refused += 1
        else:
            launched += 1
            assert not (config.backend == "ipex" and config.kmp_affinity == "disabled")
    assert refused and launched


@pytest.mark.parametrize(
    ("isa", "first", "last"),
    [
        # A Xeon with AMX: int8 and bf16 computed natively, all four ahead of the fp32 backends.
        ({"avx512_vnni": True, "amx_int8": True, "amx_bf16": True}, ["int8", "int8", "bf16", "bf16"], "fp32"),
        # AVX512-VNNI and AVX512-BF16 but no AMX: int8 first, then bf16, then the fp32 backends.
        ({"avx512_vnni": True, "avx512_bf16": True}, ["int8", "int8", "bf16", "bf16"], "fp32"),
        # An AVX2-only EPYC: int8 still first (a quarter of the bytes), bf16 emulated and last.
        ({"avx2": True}, ["int8", "int8"], "bf16"),
    ],
)
def test_the_coverage_round_measures_what_is_likely_to_win_here_first(isa, first, last):
    from autotune.tuning.payoff import order_by_payoff

    space = {
        "batch_size": [8],
        "backends": {
            "inductor": {"precision": ["fp32", "bf16"]},
            "openvino": {"precision": ["fp32", "bf16", "int8"], "streams": [1]},
            "onnxruntime": {"precision": ["fp32", "int8"]},
        },
    }
    plans = SearchSpace.parse(space, fake_machine(cores=8), RUNTIMES).coverage_params()
    ordered = order_by_payoff(plans, isa, "classify")
    precisions = [plan.params[f"{plan.params['backend']}.precision"] for plan in ordered]
    tiers = [int(plan.order.split("tier ")[1].split(":")[0]) for plan in ordered]
    assert tiers == sorted(tiers) == [plan.tier for plan in ordered]
    assert sorted(precisions[: len(first)]) == sorted(first) and first.count("int8") == precisions.count("int8")
    assert precisions[-1] == last and f"{len(plans)}/{len(plans)}" in ordered[-1].order
    # Within a tier the cheaper preparation goes first (ONNX Runtime's fp32 before OpenVINO's), except a
    # classifier's int8: OpenVINO's, the fastest in every classifier study recorded, before ONNX Runtime's.
    int8 = [plan.params["backend"] for plan in ordered if plan.params[f"{plan.params['backend']}.precision"] == "int8"]
    assert int8 == ["openvino", "onnxruntime"]
    fp32 = [plan.params["backend"] for plan in ordered if plan.params[f"{plan.params['backend']}.precision"] == "fp32"]
    assert fp32 == ["onnxruntime", "openvino", "inductor"]
    by_cost = order_by_payoff(plans, isa, "classify", int8_first=None)  # the order before, which the replay compares
    assert [p.params["backend"] for p in by_cost if p.params[f"{p.params['backend']}.precision"] == "int8"] == [
        "onnxruntime",
        "openvino",
    ]


def test_openvino_int8_coverage_runs_its_float_layers_as_openvino_itself_would_on_this_cpu():
    """On a CPU with AMX-BF16 tiles OpenVINO runs an int8 IR's float layers in bf16 by itself; the coverage
    trial does too (vit_b_16: 56.2 samples/s against 43.4 with f32 side by side on a 2-core Xeon with AMX),
    and says so."""
    from autotune.tuning.payoff import coverage_preferences, order_by_payoff

    listed = {
        "batch_size": [8],
        "backends": {
            "openvino": {"precision": ["fp32", "bf16", "int8"], "streams": [1], "int8_float": ["f32", "bf16"]}
        },
    }
    space = SearchSpace.parse(listed, fake_machine(cores=8), RUNTIMES)
    amx = {"avx512_vnni": True, "avx512_bf16": True, "amx_int8": True, "amx_bf16": True}
    preferences = coverage_preferences(amx)
    plans = space.coverage_params({key: preference.value for key, preference in preferences.items()})
    by_precision = {p["openvino.precision"]: p for p in plans}
    assert by_precision["int8"]["openvino.int8_float"] == "bf16"
    assert "openvino.int8_float" not in by_precision["fp32"] and "openvino.int8_float" not in by_precision["bf16"]
    int8_plan = next(
        plan for plan in order_by_payoff(plans, amx, "classify", preferences=preferences) if plan.tier == 0
    )
    assert int8_plan.params is by_precision["int8"] and "int8_float=bf16: what OpenVINO runs" in int8_plan.order
    # without the tiles (vector bf16 alone, or none) the space's first value, f32, and nothing said
    for isa in ({"avx512_vnni": True, "avx512_bf16": True}, {"avx2": True}):
        here = coverage_preferences(isa)
        assert ("openvino", "int8_float") not in here
        plans = space.coverage_params({key: preference.value for key, preference in here.items()})
        assert next(p for p in plans if p["openvino.precision"] == "int8")["openvino.int8_float"] == "f32"
        ordered = order_by_payoff(plans, isa, "classify", preferences=coverage_preferences(isa))
        assert not any("int8_float" in plan.order for plan in ordered)
    # a space that leaves bf16 out keeps its own value
    listed["backends"]["openvino"]["int8_float"] = ["f32"]
    plans = SearchSpace.parse(listed, fake_machine(cores=8), RUNTIMES).coverage_params(
        {("openvino", "int8_float"): "bf16"}
    )
    assert next(p for p in plans if p["openvino.precision"] == "int8")["openvino.int8_float"] == "f32"


@pytest.mark.parametrize(
    ("isa", "attention", "first"),
    [
        ({"avx2": True}, 12, "onnxruntime"),  # vit_b_16 on an AVX2-only EPYC: ONNX Runtime's dynamic int8 ran 1.8x
        ({"avx2": True}, 0, "openvino"),  # a CNN
        ({"avx2": True}, None, "openvino"),  # a reference from before the layers were counted
        ({"avx2": True, "avx512_vnni": True}, 12, "openvino"),  # with int8 dot products OpenVINO's led vit_b_16
        ({"avx2": True, "avx_vnni": True}, 12, "openvino"),  # AVX-VNNI without AVX-512: int8 dot products too
    ],
)
def test_the_int8_coverage_of_a_model_with_attention_layers_starts_with_the_faster_scheme_here(isa, attention, first):
    from autotune.tuning.payoff import int8_first_backend, order_by_payoff

    space = {
        "batch_size": [8],
        "backends": {"openvino": {"precision": ["int8"]}, "onnxruntime": {"precision": ["int8"]}},
    }
    plans = SearchSpace.parse(space, fake_machine(cores=8), RUNTIMES).coverage_params()
    ordered = order_by_payoff(plans, isa, "classify", int8_first=int8_first_backend(isa, attention))
    assert [plan.params["backend"] for plan in ordered] == [first, *({"openvino", "onnxruntime"} - {first})]
    assert "first of its tier" in ordered[0].order and "first of its tier" not in ordered[1].order


def test_bf16_without_amx_tiles_comes_right_after_int8():
    """AVX512-BF16 alone: bf16 after int8 (VNNI does twice its work per instruction), before fp32; with
    AMX-BF16 tiles it is tier 0 beside int8; a language model's bf16 (bytes per token) is tier 1 there."""
    from autotune.tuning.payoff import expected_payoff

    vector = {"avx512_vnni": True, "avx512_bf16": True}
    tiers = {p: expected_payoff("openvino", p, vector).tier for p in ("int8", "bf16", "fp32")}
    assert tiers == {"int8": 0, "bf16": 1, "fp32": 2}
    assert expected_payoff("openvino", "bf16", {**vector, "amx_bf16": True}).tier == 0
    assert expected_payoff("eager", "bf16", vector, "generate").tier == 1


@pytest.mark.parametrize(
    ("isa", "depth", "tier"),
    [
        ({"avx2": True}, 49.0, 3),  # mobilenet_v3_large on an AVX2-only EPYC: expected to lose, after the round
        ({"avx2": True}, 368.0, 1),  # resnet50 there: int8 second, as before
        ({"avx2": True}, None, 1),  # not measured: the CPU's rule alone
        ({"avx2": True, "avx512_vnni": True}, 49.0, 0),  # int8 dot products: first whatever the depth
        ({"avx2": True}, 127.9, 3),  # just under the bound
        ({"avx2": True}, 128.0, 1),  # at it
    ],
)
def test_a_shallow_models_int8_without_dot_products_runs_after_the_fp32_families(isa, depth, tier):
    """Without int8 dot products, int8's gain is in the reduction: a model whose layers reduce over few
    multiply-adds per output (mobilenet_v3_large: its int8 ran slower than eager fp32 on an AVX2-only
    EPYC) has its int8 coverage after every fp32 family, among those expected to lose."""
    from autotune.tuning.payoff import SHALLOW_REDUCTION, order_by_payoff

    space = {
        "batch_size": [8],
        "backends": {
            "openvino": {"precision": ["fp32", "bf16", "int8"], "streams": [1]},
            "onnxruntime": {"precision": ["fp32", "int8"]},
        },
    }
    plans = SearchSpace.parse(space, fake_machine(cores=8), RUNTIMES).coverage_params()
    ordered = order_by_payoff(plans, isa, "classify", reduction_depth=depth)
    int8 = [plan for plan in ordered if plan.params[f"{plan.params['backend']}.precision"] == "int8"]
    fp32 = [plan for plan in ordered if plan.params[f"{plan.params['backend']}.precision"] == "fp32"]
    assert {plan.tier for plan in int8} == {tier}
    assert all(plan.expected_to_lose == (tier == 3) for plan in int8)
    assert (ordered.index(int8[0]) > ordered.index(fp32[-1])) == (tier == 3)
    assert ("expected to lose" in int8[0].order) == (tier == 3), int8[0].order
    if tier == 3:
        assert f"over {depth:.4g} multiply-adds per output (under {SHALLOW_REDUCTION})" in int8[0].order
        assert int8[0].params["backend"] == "openvino"  # the tier's own order still holds


def test_the_reduction_depth_is_the_multiply_adds_per_output_of_the_convolutions_and_linear_layers():
    """Counted by hooks over the caller's own forward pass: a dense convolution reduces over its input
    channels x kernel, a depthwise one over its kernel alone, a linear layer over its input features."""
    import torch
    from tiny_models import tiny_cnn

    from autotune.backends.torch_common import with_reduction_depth

    model = tiny_cnn().eval()
    image = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        logits, depth = with_reduction_depth(model, lambda: model(image))
    assert logits.shape == (2, 10)  # the caller's own pass, returned
    # conv 3->16 3x3 at 32x32, conv 16->32 3x3 stride 2 at 16x16, linear 32->10
    outputs = [16 * 32 * 32, 32 * 16 * 16, 10]
    macs = [outputs[0] * 3 * 9, outputs[1] * 16 * 9, outputs[2] * 32]
    assert depth == pytest.approx(sum(macs) / sum(outputs))
    depthwise = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.Flatten())
    assert with_reduction_depth(depthwise, lambda: depthwise(torch.randn(1, 8, 6, 6)))[1] == pytest.approx(9.0)
    assert not model._forward_hooks and not model.features[0]._forward_hooks  # removed after the pass
    assert with_reduction_depth(torch.nn.ReLU(), lambda: None) == (None, None)  # nothing that reduces ran
    scripted = torch.jit.script(tiny_cnn().eval())  # no Python modules to hook: not measured, still run
    scripted_logits, scripted_depth = with_reduction_depth(scripted, lambda: scripted(image))
    assert scripted_depth is None and scripted_logits.shape == (2, 10)


def test_text_generation_covers_bf16_on_tiles_and_compiled_int8_activations_first_and_eager_int8_and_int4_last():
    """With AMX tiles bf16 (eager and inductor) and inductor's int8 activations go first (a 100M decoder at
    8 sequences on a Xeon with AMX: inductor bf16 349.9 tokens/s, eager bf16 270.5, inductor da8w8 215.9);
    eager's int8 and int4 weights are expected to lose on every CPU (eager int8 slower than bf16 or fp32
    wherever measured, int4's prefill 5.6-6.8x bf16's); without int8 dot products int8 activations
    are too, while inductor's weight-only int8 (1.11x eager fp32 on an AVX2-only EPYC) stays in tier 1."""
    from autotune.tuning.payoff import LATE_TIER, expected_payoff

    precisions = ["fp32", "bf16", "woq_int8", "da8w8", "woq_int4", "da8w4", "smoothquant_int8"]
    families = [(backend, p) for backend in ("eager", "inductor") for p in precisions]
    eager_int8 = {("eager", p) for p in ("woq_int8", "da8w8", "smoothquant_int8")}
    int4 = {(backend, p) for backend in ("eager", "inductor") for p in ("woq_int4", "da8w4")}
    amx = {"avx512f": True, "amx_int8": True, "amx_bf16": True, "avx512_bf16": True}
    payoffs = {family: expected_payoff(*family, amx, "generate") for family in families}
    tiers = {family: payoff.tier for family, payoff in payoffs.items()}
    assert {family for family, tier in tiers.items() if tier == 0} == {
        ("eager", "bf16"),
        ("inductor", "bf16"),
        ("inductor", "da8w8"),
        ("inductor", "smoothquant_int8"),
    }
    assert {family for family, tier in tiers.items() if tier >= LATE_TIER} == eager_int8 | int4
    assert tiers["inductor", "woq_int8"] == 1 and tiers["eager", "fp32"] == tiers["inductor", "fp32"] == 2
    assert all("eager's int8 expected to lose" in payoffs[family].reason for family in eager_int8)
    assert all("int4 weights expected to lose" in payoffs[family].reason for family in int4)
    # AVX512-BF16 without tiles (an EPYC with VNNI): inductor's int8 activations alone first, bf16 next
    vnni = {"avx512f": True, "avx512_vnni": True, "avx512_bf16": True}
    assert {f for f in families if expected_payoff(*f, vnni, "generate").tier == 0} == {
        ("inductor", "da8w8"),
        ("inductor", "smoothquant_int8"),
    }
    assert expected_payoff("eager", "bf16", vnni, "generate").tier == 1
    assert expected_payoff("inductor", "da8w8", {"avx2": True, "avx_vnni": True}, "generate").tier == 0
    # No int8 dot products (AVX-512 alone, or AVX2 only): int8 activations expected to lose, bf16 emulated
    for isa in ({"avx512f": True}, {"avx2": True}):
        payoffs = {family: expected_payoff(*family, isa, "generate") for family in families}
        late = {family for family, payoff in payoffs.items() if payoff.tier >= LATE_TIER}
        activations = {("inductor", p) for p in ("da8w8", "smoothquant_int8", "da8w4")}
        assert late == eager_int8 | int4 | activations | {("eager", "bf16"), ("inductor", "bf16")}, isa
        assert all("int8 activations expected to lose" in payoffs[family].reason for family in activations)
        assert payoffs["inductor", "woq_int8"].tier == 1 and payoffs["inductor", "fp32"].tier == 2


def test_the_generation_space_compiles_its_coverage_trials_with_freezing():
    """The coverage round measures each family with the first value of each option: for inductor in the
    shipped generation space that is freezing (da8w8 decoded 12% faster with it on a Xeon with AMX)."""
    from autotune.tuning.space import load_space_file

    data = load_space_file(Path(__file__).resolve().parent.parent / "search_spaces" / "generate.yaml")
    space = SearchSpace.parse(data, fake_machine(), RUNTIMES, task="generate")
    inductor = [p for p in space.coverage_params() if p["backend"] == "inductor"]
    assert inductor and all(p["inductor.freezing"] is True for p in inductor)


def test_the_generation_spaces_weight_only_coverage_runs_bf16_activations():
    """Weight-only int8 and int4 are covered with bf16 activations (A16W8 / A16W4; with fp32 ones
    torchao's CPU int4 kernel takes its slow path), which TPE may still trade for fp32; no other precision
    carries the option, so their trials are not split by a value that changes nothing."""
    from autotune.tuning.space import load_space_file

    data = load_space_file(Path(__file__).resolve().parent.parent / "search_spaces" / "generate.yaml")
    space = SearchSpace.parse(data, fake_machine(), RUNTIMES, task="generate")
    covered = {}
    for params in space.coverage_params():
        backend = params["backend"]
        covered[backend, params[f"{backend}.precision"]] = params.get(f"{backend}.activations")
    weight_only = {(b, p) for b in ("eager", "inductor") for p in ("woq_int8", "woq_int4")}
    assert weight_only <= set(covered), covered
    assert {family: value for family, value in covered.items() if value is not None} == dict.fromkeys(
        weight_only, "bf16"
    )
    assert data["backends"]["inductor"]["activations"] == ["bf16", "fp32"]  # fp32 stays searchable
    # where bf16 would be emulated (an AVX2-only EPYC), the coverage runs fp32 ones, as measured there
    from autotune.tuning.payoff import coverage_preferences

    for isa, expected in (({"avx2": True}, "fp32"), ({"avx512_bf16": True}, "bf16"), ({"amx_bf16": True}, "bf16")):
        preferred = {key: pref.value for key, pref in coverage_preferences(isa).items()}
        values = {
            params.get(f"{params['backend']}.activations")
            for params in space.coverage_params(preferred)
            if params["backend"] in ("eager", "inductor")  # torchao's; IPEX's weight-only GEMMs take lowp_mode
            and params[f"{params['backend']}.precision"] in ("woq_int8", "woq_int4")
        }
        assert values == {expected}, isa


def test_the_generation_space_covers_on_tcmalloc_from_a_glibc_baseline():
    """Coverage trials take the first allocator of the shipped generation space (tcmalloc, when installed);
    the baseline is what an untuned process runs with, glibc, whatever the order."""
    from autotune.tuning.space import load_space_file

    data = load_space_file(Path(__file__).resolve().parent.parent / "search_spaces" / "generate.yaml")
    machine = fake_machine(allocators={"tcmalloc": "/x/libtcmalloc.so.4", "jemalloc": "/x/libjemalloc.so.2"})
    space = SearchSpace.parse(data, machine, RUNTIMES, task="generate")
    assert {p["allocator"] for p in space.coverage_params()} == {"tcmalloc"}
    baseline = space.baseline_params()
    assert baseline is not None and baseline["allocator"] == "glibc"
    without = SearchSpace.parse(data, fake_machine(allocators={}), RUNTIMES, task="generate")
    assert {p["allocator"] for p in without.coverage_params()} == {"glibc"}  # not installed: dropped with a note


def test_the_finalists_reserve_is_sized_from_what_completed_trials_cost():
    """At most --finalist-share of the budget; after three completed trials, (finalists + baseline) x
    repeats runs at their median cost without preparation, times the margin; none without finalists."""
    from autotune.records.metrics import TrialBudget
    from autotune.tuning.stage_times import RESERVE_MARGIN, FinalistReserve

    study = optuna.create_study(direction="maximize")
    reserve = FinalistReserve(study, deadline=5000.0, budget_s=3600.0, share=0.2, finalists=3, repeats=3)
    assert reserve.reserve_s() == 720.0 and reserve.search_deadline() == 5000.0 - 720.0  # nothing measured yet
    for total, preparing in ((12.0, 0.0), (40.0, 30.0), (9.0, 0.0)):  # costs 12, 10, 9: median 10
        trial = study.ask()
        trial.set_user_attr("budget", TrialBudget(total_s=total, preparing_s=preparing).to_json())
        study.tell(trial, 1.0)
    assert reserve.reserve_s() == pytest.approx(RESERVE_MARGIN * 4 * 3 * 10.0)  # 180 s, not 720
    costly = FinalistReserve(study, deadline=5000.0, budget_s=600.0, share=0.2, finalists=3, repeats=3)
    assert costly.reserve_s() == 120.0  # the share caps it
    assert FinalistReserve(study, 5000.0, 3600.0, 0.2, finalists=0, repeats=3).reserve_s() == 0.0


def test_a_coverage_trial_of_a_backend_that_took_too_long_to_start_is_deferred():
    from autotune.records.metrics import TrialBudget
    from autotune.tuning.stage_times import deferral

    compiled = TrialBudget(total_s=100.0, starting_s=5.0, loading_s=70.0, warmup_s=5.0, measuring_s=20.0)
    quick = TrialBudget(total_s=20.0, starting_s=2.0, loading_s=1.0, measuring_s=17.0)
    assert deferral("inductor", "fp32", [], 60.0) is None  # nothing known yet: measured
    assert deferral("inductor", "fp32", [(3, "fp32", quick)], 60.0) is None
    reason = deferral("inductor", "fp32", [(3, "fp32", quick), (5, "fp32", compiled)], 240.0)
    assert reason == "deferred: inductor took 75s to start, prepare and load in trial 5, more than 25% of the 240s left"
    assert deferral("inductor", "fp32", [(5, "fp32", compiled)], 400.0) is None  # 75 s is under a quarter of 400 s
    # An int8 quantization's preparation (vit_b_16 into an OpenVINO IR: most of 146 s, pruned on drift)
    # does not defer the same backend's fp32 coverage trial; it does defer another int8 one.
    quantized = TrialBudget(total_s=146.0, starting_s=30.0, preparing_s=110.0, loading_s=6.0)
    assert deferral("openvino", "fp32", [(2, "int8", quantized)], 333.0) is None
    assert deferral("openvino", "int8", [(2, "int8", quantized)], 333.0) == (
        "deferred: openvino took 146s to start, prepare and load in trial 2, more than 25% of the 333s left"
    )
    assert deferral("openvino", "fp32", [(2, "int8", quantized)], 100.0) == (
        "deferred: openvino took 36s to start and load (its int8 preparation left out) in trial 2, "
        "more than 25% of the 100s left"
    )
    # another precision's slow start (a language model's int4 weights: 576 s in eager) is not the estimate
    # while a quicker one of the same backend is known; the precision's own is
    slow_int4 = TrialBudget(total_s=600.0, starting_s=566.0, preparing_s=8.0, loading_s=10.0)
    eager_bf16 = TrialBudget(total_s=50.0, starting_s=6.0, loading_s=8.0, measuring_s=20.0)
    earlier = [(4, "bf16", eager_bf16), (8, "woq_int4", slow_int4)]
    assert deferral("eager", "fp32", earlier, 1370.0) is None
    assert deferral("eager", "woq_int4", earlier, 1370.0) == (
        "deferred: eager took 584s to start, prepare and load in trial 8, more than 25% of the 1370s left"
    )


def test_once_a_family_leads_the_leader_is_measured_with_every_other_instance_split():
    """The layout round (tuning/layouts.py) on a real Optuna study and the space of an 8-core machine:
    nothing while a trial waits; then, as soon as a trial other than the baseline leads, the best clean
    trial (not a faster noisy one) with 2, 4 and 8 instances, each with the most threads that fit,
    everything else as it was, even while a coverage trial runs in another worker; not again for a new
    leader of the same family; and not for the latency objective or a space with one instance count."""
    from autotune.tuning.layouts import LayoutRound, layout_variants

    space = SearchSpace.parse(
        {"batch_size": [8, 16], "instances": [1, 2, 4, 8], "backends": {"eager": {"precision": ["fp32"]}}},
        fake_machine(cores=8),
        RUNTIMES,
    )
    waiting = (optuna.trial.TrialState.WAITING,)
    study = optuna.create_study(direction="maximize")
    layouts = LayoutRound(space, "throughput")
    plans = space.coverage_params()
    for value, valid in ((100.0, True), (150.0, False)):
        study.enqueue_trial(plans[0], user_attrs={"coverage": True})
        trial = study.ask()
        space.suggest(trial)
        trial.set_user_attr("valid", valid)
        trial.set_user_attr("config_summary", f"eager fp32 #{trial.number}")
        study.enqueue_trial({**plans[0], "threads_per_instance": 7})  # one more waits: the round is not due
        layouts(study, study.tell(trial, value))
        assert Attr.LAYOUT_ROUND not in study.user_attrs
        elsewhere = study.ask()  # it runs in another worker of a fleet, as a coverage trial
        elsewhere.set_user_attr("coverage", True)
        if valid:
            study.tell(elsewhere, state=optuna.trial.TrialState.PRUNED)
    layouts(study)  # a coverage trial still runs elsewhere: #0 leads, the round does not wait for it
    assert study.user_attrs[Attr.LAYOUT_ROUND] == 0  # the clean leader, not the noisy trial that measured faster
    study.tell(elsewhere, state=optuna.trial.TrialState.PRUNED)
    layouts_run = []
    for _ in range(3):  # the three held variants, released one at a time (no coverage held to take turns)
        assert len(study.get_trials(states=waiting)) == 1
        trial = study.ask()
        config = space.suggest(trial)
        layouts_run.append((config.instances, config.threads_per_instance))
        assert {k: v for k, v in trial.params.items() if k not in ("instances", "threads_per_instance")} == {
            k: v for k, v in plans[0].items() if k not in ("instances", "threads_per_instance")
        }
        assert trial.user_attrs["layout"] and trial.user_attrs["order"].startswith("layout round: the leader #0")
        layouts(study, study.tell(trial, 90.0))
    assert layouts_run == [(2, 4), (4, 2), (8, 1)]
    study.enqueue_trial({**plans[0], "batch_size": 16}, user_attrs={"coverage": True})
    newer = study.ask()
    space.suggest(newer)
    layouts(study, study.tell(newer, 200.0))  # a new clean leader of the family the round split
    assert not study.get_trials(states=waiting) and study.user_attrs[Attr.LAYOUT_ROUND] == 0  # its family was split

    assert layout_variants({"instances": 2, "threads_per_instance": 1}, [1, 2, 4], [3, 1], 4) == [
        {"instances": 1, "threads_per_instance": 3},  # the most listed threads that fit
        {"instances": 4, "threads_per_instance": 1},
    ]
    assert layout_variants({"instances": 1}, [1, 2], [3], 4) == []  # 3 threads do not fit twice in 4 cores
    two_cores = {"instances": 1, "threads_per_instance": 2, "batch_size": 8, "backend": "onnxruntime"}
    assert layout_variants(two_cores, [1, 2], None, 2, [1, 2, 4, 8, 16]) == [
        {**two_cores, "instances": 2, "threads_per_instance": 1, "batch_size": 4},  # 8 in flight, as the leader
        {**two_cores, "instances": 2, "threads_per_instance": 1},
    ]
    split = {**two_cores, "instances": 2, "threads_per_instance": 1, "batch_size": 4}
    assert [v["batch_size"] for v in layout_variants(split, [1, 2], None, 2, [4, 8])] == [8, 4]
    assert [v["batch_size"] for v in layout_variants({**two_cores, "batch_size": 1}, [1, 2], None, 2, [1, 8])] == [1]
    assert [v["batch_size"] for v in layout_variants(two_cores, [1, 2], None, 2, [8, 16])] == [8]  # 4 not listed
    noisy_only = optuna.create_study(direction="maximize")
    noisy_only.add_trial(study.trials[2])  # flagged noisy: on a loaded machine the best guess is still a guess
    LayoutRound(space, "throughput")(noisy_only, noisy_only.trials[0])
    assert noisy_only.user_attrs[Attr.LAYOUT_ROUND] == 0 and len(noisy_only.get_trials(states=waiting)) == 1
    assert len(noisy_only.user_attrs[Attr.LAYOUT_QUEUE]) == 2  # the other two splits, held
    for objective, instances in (("latency", [1, 2, 4, 8]), ("throughput", [1])):
        other = optuna.create_study(direction="minimize" if objective == "latency" else "maximize")
        other.add_trial(study.trials[0])
        LayoutRound(replace(space, instances=instances), objective)(other, other.trials[0])
        assert Attr.LAYOUT_ROUND not in other.user_attrs and not other.get_trials(states=waiting)


def test_a_coverage_family_that_takes_the_lead_after_the_first_round_gets_a_round_of_its_own():
    """Each family's best split is its own (a random-init vit_b_16 on an EPYC with VNNI: ONNX Runtime int8
    5% faster as two one-thread instances, OpenVINO int8 40%): a coverage trial of another backend x
    precision that takes the lead after the first round is measured with the other splits too, once,
    saying so; a new leader of a split family, or one the sampler found, is not. Text generation has its
    own rule instead (each split a compile of minutes: the next test)."""
    from autotune.tuning.layouts import LayoutRound

    space = SearchSpace.parse(
        {"batch_size": [8], "instances": [1, 2], "backends": {"eager": {"precision": ["fp32", "bf16"]}}},
        fake_machine(cores=8),
        RUNTIMES,
    )
    fp32, bf16 = space.coverage_params()
    waiting = (optuna.trial.TrialState.WAITING,)

    def measured(study, params, value, **attrs):
        study.enqueue_trial(params, user_attrs=attrs)
        trial = study.ask()
        trial.set_user_attr("config", space.suggest(trial).to_json())
        return study.tell(trial, value)

    def split_leaders(study):
        return [t.user_attrs["order"].split(" (")[0] for t in study.get_trials(states=waiting)]

    study = optuna.create_study(direction="maximize")
    layouts = LayoutRound(space, "throughput")
    layouts(study, measured(study, fp32, 100.0, coverage=True))
    assert study.user_attrs[Attr.LAYOUT_ROUND] == 0 and split_leaders(study) == ["layout round: the leader #0"]
    study.tell(study.ask(), 90.0)  # the split of fp32
    layouts(study, measured(study, bf16, 150.0, coverage=True))  # bf16 takes the lead
    assert split_leaders(study) == ["layout round: the leader #2"]
    (split,) = study.get_trials(states=waiting)
    assert split.system_attrs["fixed_params"] == {**bf16, "instances": 2, "threads_per_instance": 4}
    assert study.user_attrs[Attr.LAYOUT_ROUNDS_LATER] == [2] and study.user_attrs[Attr.LAYOUT_ROUND] == 0
    study.tell(study.ask(), 140.0)
    layouts(study, measured(study, {**bf16, "batch_size": 8}, 160.0, coverage=True))  # bf16 again: split
    assert not study.get_trials(states=waiting) and study.user_attrs[Attr.LAYOUT_ROUNDS_LATER] == [2]

    sampled = optuna.create_study(direction="maximize")
    layouts(sampled, measured(sampled, fp32, 100.0, coverage=True))
    sampled.tell(sampled.ask(), 90.0)
    layouts(sampled, measured(sampled, bf16, 150.0))  # found by the sampler, which explores layouts itself
    assert not sampled.get_trials(states=waiting) and Attr.LAYOUT_ROUNDS_LATER not in sampled.user_attrs

    generation = SearchSpace.parse(
        {"sequences": [2], "instances": [1, 2], "backends": {"eager": {"precision": ["fp32", "bf16"]}}},
        fake_machine(cores=8),
        RUNTIMES,
        task="generate",
    )
    assert LayoutRound(space, "throughput").later_rounds and not LayoutRound(generation, "throughput").later_rounds
    assert (
        LayoutRound(generation, "throughput").coverage_at_round_layout
        and not LayoutRound(space, "throughput").coverage_at_round_layout
    )


def test_a_generation_layout_round_then_measures_its_best_layout_with_the_most_sequences():
    """One sequence in the coverage round (a study under a token latency bound, the baseline leading, or
    a study begun before the coverage ran the most); whether eight pay is the machine's (170 against 98 tokens/s
    on an EPYC with VNNI, 231 against 361 on a Xeon with AMX): once the leader's split is measured, the
    better of the two layouts is measured again with the space's most sequences (at most 8x its own),
    once per study; not with a token latency bound, nor in a classifier's round."""
    from autotune.tuning.layouts import LayoutRound, most_sequences_variant

    data = {"sequences": [2, 4, 8, 16], "instances": [1, 2], "backends": {"eager": {"precision": ["fp32"]}}}
    space = SearchSpace.parse(data, fake_machine(cores=2, smt=1), RUNTIMES, task="generate")
    waiting = (optuna.trial.TrialState.WAITING,)

    def layouts_of(study):
        fixed = [t.system_attrs["fixed_params"] for t in study.get_trials(states=waiting)]
        return [(p["instances"], p["threads_per_instance"], p["sequences"]) for p in fixed]

    def run(study, layouts, value):
        trial = study.ask()
        space.suggest(trial)
        trial.set_user_attr("valid", True)
        layouts(study, study.tell(trial, value))

    for split_value, best_layout in ((150.0, (2, 1, 16)), (50.0, (1, 2, 16))):
        study = optuna.create_study(direction="maximize")
        layouts = LayoutRound(space, "throughput")
        study.enqueue_trial(space.coverage_params()[0], user_attrs={"coverage": True})
        run(study, layouts, 100.0)  # the leader, 1 x 2 with two sequences
        # its split first, alone: the same two sequences in all, one on each instance
        assert study.user_attrs[Attr.LAYOUT_ROUND] == 0 and layouts_of(study) == [(2, 1, 2)]
        run(study, layouts, split_value)
        assert layouts_of(study) == [best_layout]  # the better layout with 16 sequences (8x)
        best = 1 if split_value > 100.0 else 0
        assert study.user_attrs[Attr.SEQUENCES_ROUND] == best
        order = study.get_trials(states=waiting)[0].user_attrs["order"]
        assert order.startswith(f"layout round: the best layout #{best} ") and order.endswith(
            "16 sequences (the most the space lists)"
        )
        run(study, layouts, 120.0)
        assert layouts_of(study) == []  # once per study
    bounded = optuna.create_study(direction="maximize")
    layouts = LayoutRound(space, "throughput", more_sequences=False)  # --ttft-slo-ms or --tpot-slo-ms
    bounded.enqueue_trial(space.coverage_params()[0], user_attrs={"coverage": True})
    run(bounded, layouts, 100.0)
    run(bounded, layouts, 150.0)
    assert layouts_of(bounded) == [] and Attr.SEQUENCES_ROUND not in bounded.user_attrs
    assert most_sequences_variant({"sequences": 8}, [1, 8], "sequences") is None  # already the most
    assert most_sequences_variant({"sequences": 1}, [1, 16], "sequences") is None  # more than 8x: too far a jump
    assert most_sequences_variant({"sequences": 2}, [1, 4, 16, 64], "sequences") == {"sequences": 16}
    # a total the instances split evenly: 12 is not, over 8
    assert most_sequences_variant({"sequences": 2, "instances": 8}, [2, 8, 12], "sequences") == {
        "sequences": 8,
        "instances": 8,
    }
    classify_data = {"batch_size": [1, 2, 4, 8], "instances": [1, 2], "backends": data["backends"]}
    classify = SearchSpace.parse(classify_data, fake_machine(cores=2, smt=1), RUNTIMES)
    assert not LayoutRound(classify, "throughput").more_sequences


def test_generation_coverage_runs_the_most_sequences_and_a_split_keeps_the_total():
    """Text generation's throughput without a token latency bound: the coverage round runs every family
    with the most sequences the space lists (at most 8x the baseline's one), since a decode step reads every
    weight for all of them; a latency objective, a token bound or a classifier keep the baseline's batch.
    A generation leader's splits keep its total sequences (each instance runs its share: the same work),
    and no most-sequences trial follows when the leader already runs the most."""
    from autotune.tuning.layouts import LayoutRound, coverage_batch

    data = {"sequences": [1, 2, 4, 8, 16], "instances": [1, 2], "backends": {"eager": {"precision": ["fp32"]}}}
    space = SearchSpace.parse(data, fake_machine(cores=2, smt=1), RUNTIMES, task="generate")
    assert coverage_batch(space, "throughput", more_sequences=True) == 8  # 16 is more than 8x the baseline's
    assert coverage_batch(space, "throughput", more_sequences=False) == 1  # --ttft-slo-ms / --tpot-slo-ms
    assert coverage_batch(space, "latency", more_sequences=True) == 1
    assert coverage_batch(space, "pareto", more_sequences=True) == 1
    classify_data = {"batch_size": [1, 8, 32], "instances": [1, 2], "backends": data["backends"]}
    classify = SearchSpace.parse(classify_data, fake_machine(cores=2, smt=1), RUNTIMES)
    assert coverage_batch(classify, "throughput", more_sequences=True) == classify.baseline_batch_size == 8
    space = SearchSpace.parse(
        {**data, "sequences": [1, 2, 4, 8]}, fake_machine(cores=2, smt=1), RUNTIMES, task="generate"
    )
    (plan,) = space.coverage_params(batch=coverage_batch(space, "throughput", more_sequences=True))
    assert (plan["sequences"], space.baseline_params()["sequences"]) == (8, 1)

    study = optuna.create_study(direction="maximize")
    study.enqueue_trial(plan, user_attrs={"coverage": True})
    layouts = LayoutRound(space, "throughput")
    trial = study.ask()
    space.suggest(trial)
    trial.set_user_attr("valid", True)
    layouts(study, study.tell(trial, 100.0))
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    fixed = [t.system_attrs["fixed_params"] for t in waiting]
    assert [(p["instances"], p["threads_per_instance"], p["sequences"]) for p in fixed] == [(2, 1, 8)]
    assert study.user_attrs[Attr.LAYOUT_QUEUE] == []
    trial = study.ask()
    assert space.suggest(trial).batch_size == 4  # 8 sequences in all: 4 on each of the two instances
    trial.set_user_attr("valid", True)
    layouts(study, study.tell(trial, 150.0))
    assert study.user_attrs[Attr.SEQUENCES_ROUND] == -1  # the leader already runs the most sequences
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))


def test_a_generation_studys_coverage_after_the_round_runs_at_the_rounds_best_layout():
    """Text generation has no round for each family that leads; the coverage trials released after the
    first round run at its best layout instead (its leader's or a split's, at the leader's sequences),
    saying so; where the leader's layout won, they run as they were."""

    from autotune.tuning.layouts import LayoutRound

    data = {"sequences": [8], "instances": [1, 2], "backends": {"eager": {"precision": ["fp32", "bf16", "woq_int8"]}}}
    space = SearchSpace.parse(data, fake_machine(cores=2, smt=1), RUNTIMES, task="generate")
    waiting = (optuna.trial.TrialState.WAITING,)

    def run(study, layouts, value):
        trial = study.ask()
        space.suggest(trial)
        trial.set_user_attr("valid", True)
        layouts(study, study.tell(trial, value))
        return [(t.system_attrs["fixed_params"], t.user_attrs["order"]) for t in study.get_trials(states=waiting)]

    def started(space):
        fp32, bf16, woq = space.coverage_params()
        study = optuna.create_study(direction="maximize")
        study.enqueue_trial(fp32, user_attrs={"coverage": True})
        queue = [{"params": p, "order": f"coverage {n}/3", "late": n == 3} for n, p in ((2, bf16), (3, woq))]
        study.set_user_attr(Attr.COVERAGE_QUEUE, queue)
        return study, bf16, woq

    split_layout = {"instances": 2, "threads_per_instance": 1}
    for split_value, layout in ((120.0, split_layout), (90.0, {})):
        study, bf16, woq = started(space)
        layouts = LayoutRound(space, "throughput")
        ((split, _),) = run(study, layouts, 100.0)  # the leader, 1 x 2
        assert study.user_attrs[Attr.LAYOUT_ROUND] == 0 and split["instances"] == 2
        ((released, order),) = run(study, layouts, split_value)  # its split; then bf16's coverage
        assert released == {**bf16, **layout}, order
        assert order.endswith("(at the layout round's best layout: 2 instance(s) x 1 thread(s))") == bool(layout)
        ((late, order),) = run(study, layouts, 50.0)  # the family expected to lose, after the round, alike
        assert late == {**woq, **layout} and "after the layout round" in order

    # a leader at another layout (a prior winner as 2 x 1) whose split was pruned: its own layout
    study, bf16, _ = started(space)
    study.enqueue_trial(
        {**bf16, "eager.precision": "woq_int8", **split_layout}, user_attrs={"prior": True, "order": "p"}
    )
    layouts = LayoutRound(space, "throughput")
    run(study, layouts, 50.0)  # fp32's coverage; the prior next
    ((split, _),) = run(study, layouts, 100.0)  # the prior leads; its split, 1 x 2, next
    assert (split["instances"], split["threads_per_instance"]) == (1, 2)
    pruned = study.ask()
    space.suggest(pruned)
    layouts(study, study.tell(pruned, state=optuna.trial.TrialState.PRUNED))
    ((released, order),) = [
        (t.system_attrs["fixed_params"], t.user_attrs["order"]) for t in study.get_trials(states=waiting)
    ]
    assert released == {**bf16, **split_layout} and order.endswith("2 instance(s) x 1 thread(s))"), order


def test_a_generation_rounds_splits_run_back_to_back_and_a_fleets_later_splits_are_kept():
    """Text generation's splits run back to back even with coverage held (its most-sequences trial
    follows the splits of the leader it measures; a family leading in between would get none), then the
    most sequences, then the coverage. A worker releasing a split drops it from the queue as stored, so
    splits another worker held meanwhile (a later leader's) stay."""

    from autotune.tuning.layouts import LayoutRound

    data = {"sequences": [4, 32], "instances": [1, 2, 4], "backends": {"eager": {"precision": ["fp32", "bf16"]}}}
    space = SearchSpace.parse(data, fake_machine(cores=8, smt=1), RUNTIMES, task="generate")
    fp32, bf16 = space.coverage_params()
    waiting = (optuna.trial.TrialState.WAITING,)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial(fp32, user_attrs={"coverage": True})
    study.set_user_attr(Attr.COVERAGE_QUEUE, [{"params": bf16, "order": "coverage 2/2", "late": False}])
    layouts = LayoutRound(space, "throughput")
    released = []
    for value in (100.0, 90.0, 80.0, 70.0):
        trial = study.ask()
        space.suggest(trial)
        layouts(study, study.tell(trial, value))
        (next_trial,) = study.get_trials(states=waiting)
        fixed = next_trial.system_attrs["fixed_params"]
        released.append((fixed["eager.precision"], fixed["instances"], fixed["sequences"]))
        assert "in turn" not in next_trial.user_attrs["order"]
    assert released == [("fp32", 2, 4), ("fp32", 4, 4), ("fp32", 1, 32), ("bf16", 1, 4)]

    fleet = optuna.create_study(direction="maximize")
    mine = {"params": {**fp32, "instances": 2, "threads_per_instance": 4}, "order": "layout round: #0 as 2"}
    theirs = {"params": {**bf16, "instances": 2, "threads_per_instance": 4}, "order": "layout round: #3 as 2"}
    fleet.set_user_attr(Attr.LAYOUT_QUEUE, [theirs, mine])  # held by another worker after this one read [mine]
    LayoutRound(space, "throughput")._release(fleet, [], [mine])
    assert fleet.get_trials(states=waiting)[0].system_attrs["fixed_params"] == mine["params"]
    assert fleet.user_attrs[Attr.LAYOUT_QUEUE] == [theirs]


def test_coverage_is_released_a_trial_at_a_time_and_the_round_runs_once_a_family_leads():
    """The coverage queue kept on the study (tuning/layouts.py): released one trial at a time while the
    baseline leads; the leader's layout variants as soon as a coverage family leads, ahead of the rest;
    the families expected to lose (emulated bf16 here, tier 3) after the round, saying so. With only
    those left and the baseline leading, the round runs for the baseline once no enqueued trial runs
    elsewhere (one may lead, and the late families wait for the round); with nothing completed to
    lead a round they run at once; a study begun before the queue keeps its late plans."""
    from autotune.results.leaderboard import study_summary
    from autotune.tuning.layouts import LayoutRound
    from autotune.tuning.payoff import order_by_payoff

    space = SearchSpace.parse(
        {"batch_size": [8, 16], "instances": [1, 2], "backends": {"eager": {"precision": ["fp32", "bf16"]}}},
        fake_machine(cores=8),
        RUNTIMES,
    )
    fp32, bf16 = order_by_payoff(space.coverage_params(), {"avx2": True}, "classify")
    assert (fp32.expected_to_lose, bf16.expected_to_lose) == (False, True) and bf16.tier == 3
    baseline = {**fp32.params, "batch_size": 8}
    covered = {**fp32.params, "batch_size": 16}
    late = {"params": bf16.params, "order": bf16.order, "late": True}
    waiting = (optuna.trial.TrialState.WAITING,)

    def run(study, value):
        trial = study.ask()
        space.suggest(trial)
        return study.tell(trial, value)

    may_lead = {"params": {**bf16.params, "batch_size": 16}, "order": "coverage 2/3", "late": False}
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial(baseline, user_attrs={"baseline": True})
    study.set_user_attr(
        Attr.COVERAGE_QUEUE, [{"params": covered, "order": "coverage 1/3", "late": False}, may_lead, late]
    )
    layouts = LayoutRound(space, "throughput")
    layouts(study)  # the baseline waits: nothing moves
    assert len(study.user_attrs[Attr.COVERAGE_QUEUE]) == 3
    layouts(study, run(study, 100.0))  # the baseline leads: the next coverage trial, no round
    (released,) = study.get_trials(states=waiting)
    assert released.system_attrs["fixed_params"] == covered
    assert released.user_attrs == {"coverage": True, "order": "coverage 1/3"}
    assert Attr.LAYOUT_ROUND not in study.user_attrs and study.user_attrs[Attr.COVERAGE_QUEUE] == [may_lead, late]
    assert study_summary(study) == "2 trials: 1 COMPLETE, 1 WAITING; 2 coverage trial(s) not run yet"

    def released_next():
        (trial,) = study.get_trials(states=waiting)
        params = trial.system_attrs["fixed_params"]
        return params["backend"], params["eager.precision"], params["instances"], params["batch_size"], trial

    layouts(study, run(study, 120.0))  # a coverage family leads: its splits, in turn with the coverage that may lead
    *split, first = released_next()
    assert split == ["eager", "fp32", 2, 8] and study.user_attrs[Attr.LAYOUT_ROUND] == 1  # the samples in flight first
    assert first.user_attrs["layout"] and first.user_attrs["order"].endswith(
        "batch_size 8 (the same samples in flight) (in turn with the 1 coverage trial(s) that may lead, still held)"
    )
    assert study_summary(study) == (
        "3 trials: 2 COMPLETE, 1 WAITING; 2 coverage trial(s) not run yet; 1 layout round split(s) not run yet"
    )
    layouts(study, run(study, 90.0))
    *coverage, trial = released_next()
    assert coverage == ["eager", "bf16", 1, 16] and trial.user_attrs["order"] == "coverage 2/3"
    layouts(study, run(study, 90.0))
    *split, trial = released_next()  # the other split, then only the family expected to lose is left
    assert split == ["eager", "fp32", 2, 16] and "in turn" not in trial.user_attrs["order"]
    assert study.user_attrs[Attr.COVERAGE_QUEUE] == [late]
    layouts(study, run(study, 90.0))
    (after,) = study.get_trials(states=waiting)
    assert after.user_attrs["coverage"] and after.user_attrs["order"] == f"{bf16.order} (after the layout round)"
    assert study.user_attrs[Attr.COVERAGE_QUEUE] == []

    baseline_leads = optuna.create_study(direction="maximize")
    baseline_leads.enqueue_trial(baseline, user_attrs={"baseline": True})
    baseline_leads.enqueue_trial(covered, user_attrs={"coverage": True})
    baseline_leads.set_user_attr(Attr.COVERAGE_QUEUE, [late])
    done = run(baseline_leads, 100.0)
    elsewhere = baseline_leads.ask()  # the last coverage trial runs in another worker of a fleet: it may lead
    layouts(baseline_leads, done)
    assert Attr.LAYOUT_ROUND not in baseline_leads.user_attrs and baseline_leads.user_attrs[Attr.COVERAGE_QUEUE] == [
        late
    ]
    layouts(baseline_leads, baseline_leads.tell(elsewhere, state=optuna.trial.TrialState.PRUNED))
    # only bf16 left, nothing running: the baseline's split first
    assert baseline_leads.user_attrs[Attr.LAYOUT_ROUND] == 0
    assert [t.user_attrs.get("layout") for t in baseline_leads.get_trials(states=waiting)] == [True]

    nothing_led = optuna.create_study(direction="maximize")
    nothing_led.set_user_attr(Attr.COVERAGE_QUEUE, [late])
    layouts(nothing_led)  # no completed trial: the late coverage at once, no round yet
    (queued_now,) = nothing_led.get_trials(states=waiting)
    assert queued_now.user_attrs["order"].endswith("(no completed trial to lead a layout round)")
    assert Attr.LAYOUT_ROUND not in nothing_led.user_attrs
    layouts(nothing_led, run(nothing_led, 10.0))
    assert nothing_led.user_attrs[Attr.LAYOUT_ROUND] == 0  # the bf16 trial leads: its split is queued

    # A run that died after the round was marked and before the late coverage was enqueued: the next call
    # releases it; so does a process with no round of its own (a fleet worker with one instance count);
    # a study begun before the queue existed holds its late plans under their old name.
    for study_objective, round_marked, attr, after_text in (
        ("throughput", True, Attr.COVERAGE_QUEUE, "(after the layout round)"),
        ("latency", False, Attr.COVERAGE_QUEUE, "(after the enqueued rounds; no layout round in this process)"),
        ("throughput", True, Attr.LATE_COVERAGE, "(after the layout round)"),
    ):
        died = optuna.create_study(direction="maximize")
        died.set_user_attr(attr, [{**late, "params": covered}, late])  # the first already ran: skipped
        died.enqueue_trial(covered)
        died.tell(died.ask(), 1.0)
        if round_marked:
            died.set_user_attr(Attr.LAYOUT_ROUND, 0)
        LayoutRound(space, study_objective)(died)
        (released,) = died.get_trials(states=waiting)
        assert released.user_attrs["order"].endswith(after_text) and died.user_attrs[Attr.COVERAGE_QUEUE] == []


def test_a_generation_coverage_trial_whose_quantized_weights_drifted_elsewhere_runs_after_the_others():
    """Text generation loads one quantized artifact per precision and its options on every backend, so
    once an eager trial is pruned on drift, the coverage trials that load the same weights (inductor's woq_int4
    after eager's) are moved behind the rest of the round (one expected to lose: behind the other late
    families), saying why; other group sizes and precisions keep their place, and so do fp32 and bf16
    (each backend converts them its own way)."""
    from autotune.tuning.layouts import LayoutRound

    space = SearchSpace.parse(
        {
            "sequences": [1, 2],
            "instances": [1, 2],
            "backends": {
                "eager": {"precision": ["fp32", "woq_int4", "woq_int8"], "group_size": [128, 32]},
                "inductor": {"precision": ["woq_int4", "woq_int8"], "group_size": [128, 32]},
            },
        },
        fake_machine(cores=8),
        RUNTIMES,
        task="generate",
    )
    plans = {(p["backend"], p[f"{p['backend']}.precision"]): p for p in space.coverage_params()}
    other_group = {**plans["inductor", "woq_int4"], "inductor.group_size": 32}
    queue = [
        {"params": params, "order": f"coverage {n}", "late": False}
        for n, params in enumerate((plans["inductor", "woq_int4"], other_group, plans["inductor", "woq_int8"]), 2)
    ]
    waiting = (optuna.trial.TrialState.WAITING,)

    def pruned_on_drift(study, params):
        study.enqueue_trial(params)
        trial = study.ask()
        trial.set_user_attr("config", space.suggest(trial).to_json())
        trial.set_user_attr("prune_reason", "drift: relative_l2 drop 0.409 > max 0.05")
        return study.tell(trial, state=optuna.trial.TrialState.PRUNED)

    study = optuna.create_study(direction="maximize")
    study.set_user_attr(Attr.COVERAGE_QUEUE, queue)
    layouts = LayoutRound(space, "throughput")
    layouts(study, pruned_on_drift(study, plans["eager", "woq_int4"]))
    (released,) = study.get_trials(states=waiting)
    assert released.system_attrs["fixed_params"] == other_group  # group 32: other weights, not deferred
    held = study.user_attrs[Attr.COVERAGE_QUEUE]
    assert [plan["params"] for plan in held] == [plans["inductor", "woq_int8"], plans["inductor", "woq_int4"]]
    assert held[1]["deferred"] and not held[1].get("late")
    assert (
        held[1]["order"] == "coverage 2 (after the other coverage: trial 0 pruned the same quantized weights on drift)"
    )

    # Behind the other coverage, not behind the families expected to lose: those still wait for the round.
    late = {"params": plans["eager", "fp32"], "order": "coverage 9", "late": True}
    baseline_leads = optuna.create_study(direction="maximize")
    baseline_leads.enqueue_trial(plans["eager", "fp32"], user_attrs={"baseline": True})
    baseline_leads.tell(baseline_leads.ask(), 45.0)
    baseline_leads.set_user_attr(Attr.COVERAGE_QUEUE, [queue[0], late])
    layouts(baseline_leads, pruned_on_drift(baseline_leads, plans["eager", "woq_int4"]))
    (next_up,) = baseline_leads.get_trials(states=waiting)
    assert next_up.system_attrs["fixed_params"] == plans["inductor", "woq_int4"], "deferred once, then released"
    assert baseline_leads.user_attrs[Attr.COVERAGE_QUEUE] == [late]

    # A family expected to lose whose weights drifted in eager's trial goes behind the other late families, once.
    late_other = {"params": plans["eager", "fp32"], "order": "coverage 8", "late": True}

    def after_round_with(waiting_plan: dict, pruned: dict) -> optuna.study.Study:
        after_round = optuna.create_study(direction="maximize")
        after_round.set_user_attr(Attr.LAYOUT_ROUND, 0)
        after_round.set_user_attr(Attr.SEQUENCES_ROUND, -1)
        late_drifted = {"params": waiting_plan, "order": "coverage 7", "late": True}
        after_round.set_user_attr(Attr.COVERAGE_QUEUE, [late_drifted, late_other])
        layouts(after_round, pruned_on_drift(after_round, pruned))
        return after_round

    after_round = after_round_with(plans["inductor", "woq_int8"], plans["eager", "woq_int8"])
    (next_up,) = after_round.get_trials(states=waiting)
    assert next_up.system_attrs["fixed_params"] == plans["eager", "fp32"]
    (held_late,) = after_round.user_attrs[Attr.COVERAGE_QUEUE]
    assert held_late["params"] == plans["inductor", "woq_int8"] and held_late["deferred"] and held_late["late"]
    # A drift in a compiled trial is not the weights': inductor's own kernels can break what eager runs well
    # (da8w8 decoded garbage at one sequence on a Xeon with AMX; eager's trial of the same weights passed).
    compiled_drift = after_round_with(plans["eager", "woq_int8"], plans["inductor", "woq_int8"])
    (next_up,) = compiled_drift.get_trials(states=waiting)
    assert next_up.system_attrs["fixed_params"] == plans["eager", "woq_int8"], "held back by inductor's drift"

    # fp32 and bf16 are each backend's own conversion: a drifted eager bf16 leaves inductor's in its place.
    bf16_space = SearchSpace.parse(
        {
            "sequences": [1],
            "instances": [1, 2],
            "backends": {"eager": {"precision": ["bf16"]}, "inductor": {"precision": ["bf16"]}},
        },
        fake_machine(cores=8),
        RUNTIMES,
        task="generate",
    )
    eager_bf16, inductor_bf16 = bf16_space.coverage_params()
    assert released_after_a_drift(bf16_space, inductor_bf16, eager_bf16) == ("coverage 2", [])


def released_after_a_drift(space: SearchSpace, queued: dict, pruned: dict) -> tuple[str, list]:
    """A study holding one coverage plan, `queued`, when a trial of `pruned` is pruned on drift: the order
    the plan is released with, and the queue left."""
    from autotune.tuning.layouts import LayoutRound

    study = optuna.create_study(direction="maximize")
    study.set_user_attr(Attr.COVERAGE_QUEUE, [{"params": queued, "order": "coverage 2", "late": False}])
    study.enqueue_trial(pruned)
    trial = study.ask()
    trial.set_user_attr("config", space.suggest(trial).to_json())
    trial.set_user_attr("prune_reason", "drift: relative_l2 drop 0.2 > max 0.05")
    LayoutRound(space, "throughput")(study, study.tell(trial, state=optuna.trial.TrialState.PRUNED))
    (released,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    return released.user_attrs["order"], study.user_attrs[Attr.COVERAGE_QUEUE]


def test_a_drift_measured_by_an_older_artifact_builder_is_not_reused():
    """The numerics key of an artifact backend holds its builder's version: a study resumed after the
    int8 of a model with attention layers moved from static to transformer schemes measures the new
    artifact's drift instead of pruning it on the old one's; backends without an artifact keep theirs."""
    import json

    from autotune.backends.onnxruntime import classify as onnxruntime
    from autotune.measure.drift import Drift
    from autotune.tuning.study import numerics_key_of, same_numerics_drift

    space = SearchSpace.parse(
        {"batch_size": [8], "backends": {"eager": {"precision": ["fp32"]}, "onnxruntime": {"precision": ["int8"]}}},
        fake_machine(cores=2),
        RUNTIMES,
    )
    ort = TrialConfig("onnxruntime", "int8", 8, options={"graph_optimization": "all"})
    eager = TrialConfig("eager", "fp32", 8)
    assert json.loads(numerics_key_of(ort, space))["builder"] == onnxruntime.ARTIFACT_VERSION
    assert numerics_key_of(eager, space) == eager.numerics_key()
    study = optuna.create_study(direction="maximize")
    for key, drift in ((ort.numerics_key(), 0.548), (numerics_key_of(ort, space), 0.038)):
        trial = study.ask()
        trial.set_user_attr("numerics_key", key)
        trial.set_user_attr("drift_reference", "ref")
        trial.set_user_attr("drift", Drift(drift, 0.9, 0.9, 32).to_json())
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    reused = same_numerics_drift(study, numerics_key_of(ort, space), "ref")
    assert reused is not None and reused.relative_l2 == 0.038 and reused.reused_from == 1


def test_an_engine_routed_to_another_runtime_keeps_precisions_the_main_runtimes_torchao_cannot_run():
    """torchao's unavailable precisions leave torchao's backends only: IPEX's woq_int4 (its own kernel, in
    the IPEX runtime) stays, routed there, while eager's woq_int4 is left out with the reason."""
    data = {
        "sequences": [1],
        "backends": {"eager": {"precision": ["fp32", "woq_int4"]}, "ipex": {"precision": ["woq_int4", "bf16"]}},
    }
    unavailable = {"woq_int4": "no CPU kernel in this torchao"}
    space = SearchSpace.parse(
        data, fake_machine(), RUNTIMES, task="generate", unavailable=unavailable, engine_routes={"ipex": ["ipex"]}
    )
    assert space.backends["eager"]["precision"] == ["fp32"]
    assert space.backends["ipex"]["precision"] == ["woq_int4", "bf16"]
    assert space.runtimes["ipex"] == ["ipex"] and space.runtimes["eager"] == ["main"]
    assert "precision woq_int4 cannot run here (no CPU kernel in this torchao): left out of eager" in space.notes
    assert not any("left out of ipex" in note for note in space.notes)
    # a main runtime where IPEX imports too (torch 2.8): its woq_int4 still is not torchao's
    here = SearchSpace.parse(data, fake_machine(), RUNTIMES, task="generate", unavailable=unavailable)
    assert here.backends["ipex"]["precision"] == ["woq_int4", "bf16"] and here.runtimes["ipex"] == ["main"]


def test_generation_sequences_are_the_total_split_evenly_across_instances():
    """`sequences` is the user's workload, every instance's sequences together: a trial of 8 as 2 instances
    runs 4 on each; a split that is not even is never launched; an instance count that splits no total is
    left out (said so), and a space where none does is refused in one line."""
    from autotune.tuning.layouts import layout_variants

    data = {"sequences": [1, 8], "instances": [1, 2, 3], "backends": {"eager": {"precision": ["fp32"]}}}
    notes_space = SearchSpace.parse(data, fake_machine(cores=4, smt=1), RUNTIMES, task="generate")
    assert notes_space.instances == [1, 2]
    assert any("instances [3] split none of the total sequences [1, 8]" in note for note in notes_space.notes)
    base = {
        "backend": "eager",
        "eager.precision": "fp32",
        "eager.kv_cache": "dynamic",
        "allocator": "glibc",
        "openmp": "gnu",
        "thp": False,
    }
    config = notes_space.suggest(
        optuna.trial.FixedTrial({**base, "sequences": 8, "instances": 2, "threads_per_instance": 2})
    )
    assert (config.batch_size, config.instances) == (4, 2)
    with pytest.raises(InfeasibleConfig, match="1 sequences do not split evenly over 2 instances"):
        notes_space.suggest(
            optuna.trial.FixedTrial({**base, "sequences": 1, "instances": 2, "threads_per_instance": 2})
        )
    with pytest.raises(UserError, match=r"no instance count \[2, 4\] splits any of the total sequences \[1, 3\]"):
        SearchSpace.parse(
            {**data, "sequences": [1, 3], "instances": [2, 4]}, fake_machine(cores=4, smt=1), RUNTIMES, task="generate"
        )
    leader = {**base, "sequences": 6, "instances": 1, "threads_per_instance": 4}
    variants = layout_variants(leader, [1, 2, 4], None, 4, None, "sequences", split_total=True)
    assert [(v["instances"], v["sequences"]) for v in variants] == [(2, 6)]  # 4 does not split 6
    classify_data = {"batch_size": [1], "instances": [1, 2, 3], "backends": data["backends"]}
    assert SearchSpace.parse(classify_data, fake_machine(cores=4, smt=1), RUNTIMES).instances == [1, 2, 3]
    # coverage on the first instance count that splits its total; a prior winner's total the space does not
    # list is sampled, and so are its instances
    two_first = SearchSpace.parse(
        {**data, "instances": [2, 1]}, fake_machine(cores=4, smt=1), RUNTIMES, task="generate"
    )
    assert [(p["instances"], p["sequences"]) for p in two_first.coverage_params(batch=1)] == [(1, 1)]
    assert [(p["instances"], p["sequences"]) for p in two_first.coverage_params(batch=8)] == [(2, 8)]
    kept, dropped = notes_space.offered_params({**base, "sequences": 16, "instances": 1, "threads_per_instance": 4})
    assert not {"sequences", "instances", "threads_per_instance"} & set(kept), kept
    assert {"instances=1", "threads_per_instance=4"} <= set(dropped)


def test_a_generation_coverage_starts_with_every_engines_most_promising_family_cheapest_first():
    """The engine round: before any other coverage trial, one family per engine the baseline does not
    measure (torchao apart from the backend that runs it), its first in the payoff order, the cheapest to
    prepare first; llama.cpp's int4 is not expected to lose as torchao's is (its own kernels). A 15-minute
    search on a 2-core EPYC ran six trials in the payoff order alone and none on llama.cpp or IPEX."""
    from autotune.backends import engine_of
    from autotune.tuning.payoff import order_by_payoff
    from autotune.tuning.space import load_space_file

    data = load_space_file(Path(__file__).resolve().parent.parent / "search_spaces" / "generate.yaml")
    space = SearchSpace.parse(data, fake_machine(cores=2, smt=1), RUNTIMES, task="generate")
    plans = space.coverage_params()
    engines = {engine_of(p["backend"], p[f"{p['backend']}.precision"], "generate") for p in plans}
    assert engines >= {"eager", "inductor", "torchao", "openvino", "llamacpp"}
    for isa in (
        {"avx512f": True, "amx_int8": True, "amx_bf16": True, "avx512_bf16": True},
        {"avx512f": True, "avx512_vnni": True, "avx512_bf16": True},
        {"avx2": True},
    ):
        ordered = order_by_payoff(plans, isa, "generate", measured_engines={"eager"})
        first = [plan for plan in ordered if plan.engine_round]
        assert ordered[: len(first)] == first  # the engine round leads
        firsts = [
            engine_of(p.params["backend"], p.params[f"{p.params['backend']}.precision"], "generate") for p in first
        ]
        assert sorted(firsts) == sorted(engines - {"eager"}), (isa, firsts)  # every other engine, once
        assert all("engine round" in plan.order for plan in first)
        # each is its engine's first in the payoff order
        rest = ordered[len(first) :]
        for plan in first:
            backend = plan.params["backend"]
            engine = engine_of(backend, plan.params[f"{backend}.precision"], "generate")
            later = [
                p
                for p in rest
                if engine_of(p.params["backend"], p.params[f"{p.params['backend']}.precision"], "generate") == engine
            ]
            assert all((p.tier, 0) >= (plan.tier, 0) for p in later), (engine, plan.order)
        assert firsts.index("openvino") < firsts.index("inductor")  # an IR conversion before a compile
    avx2 = order_by_payoff(plans, {"avx2": True}, "generate")
    llama = next(p for p in avx2 if p.params["backend"] == "llamacpp" and p.engine_round)
    assert llama.tier < 3 and not llama.expected_to_lose, llama.order
    classify = order_by_payoff(
        SearchSpace.parse(SPACE, fake_machine(cores=8), RUNTIMES).coverage_params(), {}, "classify"
    )
    assert not any(plan.engine_round for plan in classify)


def test_a_generation_openvino_family_runs_as_its_plugin_would_and_at_f32_side_by_side_in_the_engine_round():
    """Where the CPU computes bf16 natively, OpenVINO's CPU plugin runs bf16 activations by itself (GenAI's
    benchmark with it); the space's first, f32, made 1.20x that at 1 sequence and 0.85x at 8 on a Xeon with
    AMX. The engine round runs both, adjacent, so the search starts from the engine's own speed at every
    total; the later OpenVINO families run as the plugin would. Without native bf16: f32 alone."""
    from autotune.tuning.payoff import coverage_preferences, order_by_payoff
    from autotune.tuning.space import load_space_file

    data = load_space_file(Path(__file__).resolve().parent.parent / "search_spaces" / "generate.yaml")
    space = SearchSpace.parse(data, fake_machine(cores=2, smt=1), RUNTIMES, task="generate")

    def engine_round_and_rest(isa: dict[str, bool]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        preferences = coverage_preferences(isa)
        plans = space.coverage_params(
            {key: pref.value for key, pref in preferences.items()},
            alongside=[key for key, pref in preferences.items() if pref.alongside],
        )
        ordered = order_by_payoff(plans, isa, "generate", preferences=preferences, measured_engines={"eager"})
        openvino = [
            (p.params["openvino.precision"], p.params["openvino.inference_precision"], p.engine_round, p.order)
            for p in ordered
            if p.params["backend"] == "openvino"
        ]
        first = [(precision, hint) for precision, hint, engine_round, _ in openvino if engine_round]
        rest = [(precision, hint) for precision, hint, engine_round, _ in openvino if not engine_round]
        if len(first) == 2:  # adjacent, each saying why
            places = [i for i, p in enumerate(ordered) if p.params["backend"] == "openvino" and p.engine_round]
            assert places[1] == places[0] + 1, places
            assert "runs by itself on this CPU" in openvino[0][3] and "the space's first" in openvino[1][3]
        return first, rest

    for isa in (
        {"avx512f": True, "avx512_vnni": True, "avx512_bf16": True, "amx_int8": True, "amx_bf16": True},
        {"avx512f": True, "avx512_vnni": True, "avx512_bf16": True},  # a Zen 4: vector bf16
    ):
        first, rest = engine_round_and_rest(isa)
        assert first == [("int8_asym", "bf16"), ("int8_asym", "f32")], (isa, first)
        assert rest and {hint for _, hint in rest} == {"bf16"}, rest  # one twin, in the engine round only
    first, rest = engine_round_and_rest({"avx2": True})
    assert first == [("int8_asym", "f32")] and {hint for _, hint in rest} == {"f32"}
    # a space that lists f32 alone keeps it, without a twin
    only_f32 = SearchSpace.parse(
        {
            **data,
            "backends": {
                **data["backends"],
                "openvino": {**data["backends"]["openvino"], "inference_precision": ["f32"]},
            },
        },
        fake_machine(cores=2, smt=1),
        RUNTIMES,
        task="generate",
    )
    plans = only_f32.coverage_params(
        {("openvino", "inference_precision"): "bf16"}, alongside=[("openvino", "inference_precision")]
    )
    assert {p["openvino.inference_precision"] for p in plans if p["backend"] == "openvino"} == {"f32"}
    assert len([p for p in plans if p["backend"] == "openvino"]) == len(data["backends"]["openvino"]["precision"])
    # ... and every OpenVINO family keeps its one coverage trial (none is taken for a twin of a bf16 one)
    amx = {"avx512f": True, "avx512_vnni": True, "avx512_bf16": True, "amx_int8": True, "amx_bf16": True}
    ordered = order_by_payoff(plans, amx, "generate", preferences=coverage_preferences(amx))
    covered = sorted(p.params["openvino.precision"] for p in ordered if p.params["backend"] == "openvino")
    assert covered == sorted(data["backends"]["openvino"]["precision"]), covered
    assert not any("right after bf16" in p.order for p in ordered)


def test_the_generation_layout_round_waits_for_the_engine_round():
    """A family that leads after one engine's trial does not start the layout round (its splits back to back,
    then the most sequences) while other engines' first trials are held: they run first."""
    from autotune.tuning.layouts import LayoutRound

    data = {
        "sequences": [2],
        "instances": [1, 2],
        "backends": {"eager": {"precision": ["fp32", "bf16"]}, "inductor": {"precision": ["bf16"]}},
    }
    space = SearchSpace.parse(data, fake_machine(cores=2, smt=1), RUNTIMES, task="generate")
    _, bf16, compiled = space.coverage_params()
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial(bf16, user_attrs={"coverage": True})
    queue = [{"params": compiled, "order": "coverage 2/2; engine round", "late": False, "first": True}]
    study.set_user_attr(Attr.COVERAGE_QUEUE, queue)
    layouts = LayoutRound(space, "throughput")
    trial = study.ask()
    space.suggest(trial)
    trial.set_user_attr("valid", True)
    layouts(study, study.tell(trial, 100.0))  # eager bf16 leads; inductor's engine trial is still held
    (released,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert released.system_attrs["fixed_params"] == compiled and Attr.LAYOUT_ROUND not in study.user_attrs
    trial = study.ask()
    space.suggest(trial)
    trial.set_user_attr("valid", True)
    layouts(study, study.tell(trial, 90.0))
    assert study.user_attrs[Attr.LAYOUT_ROUND] == 0  # now the round, for the leader


def test_a_study_names_the_engines_it_never_tried():
    """A study whose budget ended with an engine's coverage held, enqueued or deferred says so (the search's
    last lines and `show`), so a user never reads a winner without knowing which engines were not measured."""
    from autotune.results.leaderboard import study_summary, untried_engines

    study = optuna.create_study(direction="maximize")
    study.set_user_attr("spec", {"task": "generate", "objective": "throughput"})
    config = {"backend": "eager", "precision": "fp32", "batch_size": 1, "instances": 1, "threads_per_instance": 2}
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={"config": config}))
    deferred = {**config, "backend": "inductor", "precision": "bf16"}
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED,
            user_attrs={
                "config": deferred,
                "deferred": True,
                "prune_reason": "deferred: inductor took 80s to start and load in trial 1",
            },
        )
    )
    held = {"backend": "llamacpp", "llamacpp.precision": "Q8_0"}
    study.set_user_attr(Attr.COVERAGE_QUEUE, [{"params": held, "order": "coverage", "late": False}])
    study.enqueue_trial({"backend": "eager", "eager.precision": "woq_int8"})
    infeasible = {"backend": "openvino", "openvino.precision": "int8_asym"}  # a prior winner that could not run
    distributions = {
        "backend": optuna.distributions.CategoricalDistribution(["openvino"]),
        "openvino.precision": optuna.distributions.CategoricalDistribution(["int8_asym"]),
    }
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED,
            params=infeasible,
            distributions=distributions,
            user_attrs={"prune_reason": "not launched: 2 instances x 2 threads exceeds the 2 physical cores"},
        )
    )
    untried = untried_engines(study)
    assert set(untried) == {"inductor", "llamacpp", "torchao", "openvino"}
    assert "exceeds the 2 physical cores" in untried["openvino"]
    assert untried["inductor"] == "deferred: inductor took 80s to start and load in trial 1"  # said once
    assert "--budget" in untried["llamacpp"]
    assert "engines never tried: inductor: deferred: inductor took" in study_summary(study)


def test_the_mix_benchmarks_space_covers_int8_first_and_lets_the_mix_search_bisect_its_shares():
    """search_spaces/generate-mix.yaml: its coverage round runs OpenVINO int8_asym for the whole model (whose
    drift decides whether a mix is needed) and the mix search finds its eight shares there (a share list the
    parser dropped would leave the search nothing to bisect)."""
    from autotune.tuning.mix_search import MixBisection
    from autotune.tuning.space import load_space_file

    data = load_space_file(Path(__file__).resolve().parent.parent / "search_spaces" / "generate-mix.yaml")
    space = SearchSpace.parse(data, fake_machine(), RUNTIMES, task="generate")
    (first, *_) = space.coverage_params()
    assert first["backend"] == "openvino" and first["openvino.precision"] == "int8_asym"
    assert first.get("openvino.compressed_share", 1.0) == 1.0
    assert MixBisection(space).shares == {"openvino": [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]}


def test_the_server_space_serves_engine_defaults_first_with_its_concurrency_apart_from_the_offline_batch():
    """search_spaces/generate-server.yaml: the server's sequences at once are each engine's server_sequences,
    up to GenAI's own 256, and the first OpenVINO configuration is GenAI's default scheduler (256 sequences,
    256 tokens a step, split-fuse); the offline batch each trial's drift runs is its own dimension."""
    from autotune.tuning.space import load_space_file

    data = load_space_file(Path(__file__).resolve().parent.parent / "search_spaces" / "generate-server.yaml")
    space = SearchSpace.parse(data, fake_machine(), RUNTIMES, task="generate")
    (first, *_) = space.coverage_params()
    assert first["backend"] == "openvino", first
    config = space.suggest(optuna.trial.FixedTrial(first))
    assert config.batch_size == 8, config
    assert config.options["server_sequences"] == 256 and config.options["max_num_batched_tokens"] == 256
    assert config.options["dynamic_split_fuse"] is True
    assert {4, 8, 16, 32} <= set(space.backends["llamacpp"]["server_sequences"])

"""TrialConfig environments and pinning, and the search space on a real Optuna study."""

from dataclasses import replace

import optuna
import pytest

from autotune.config import TrialConfig, clean_environment, pin_prefix
from autotune.errors import UserError
from autotune.probe import JEMALLOC_CONF, MachineProbe, PhysicalCore
from autotune.space import InfeasibleConfig, SearchSpace


def fake_machine(cores: int = 4, smt: int = 2, allocators=None, pinning="numactl") -> MachineProbe:
    """A described machine (not this one) to test arithmetic for bigger hosts; cpus numbered non-contiguously."""
    phys = tuple(PhysicalCore(0, i, tuple(i + k * cores for k in range(smt)), numa_node=0 if i < cores // 2 else 1) for i in range(cores))
    return MachineProbe(
        cpu_model="test", isa={}, allowed_cpus=tuple(sorted(c for core in phys for c in core.cpus)), cores=phys,
        numa_nodes={0: (), 1: ()}, allocators=allocators if allocators is not None else {"tcmalloc": "/x/libtcmalloc.so.4", "jemalloc": "/x/libjemalloc.so.2"},
        pinning=pinning,
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
    env = clean_environment({"PATH": "/bin", "LD_PRELOAD": "x", "OMP_NUM_THREADS": "9", "KMP_AFFINITY": "y", "MALLOC_CONF": "z"})
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
    space = SearchSpace.from_dict(SPACE, machine)
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


def test_space_drops_missing_allocators_with_a_note():
    space = SearchSpace.from_dict(SPACE, fake_machine(allocators={"jemalloc": "/x/libjemalloc.so.2"}))
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
        SearchSpace.from_dict({**SPACE, **bad}, fake_machine(cores=8))


def test_baseline_is_eager_fp32_on_all_cores():
    params = SearchSpace.from_dict(SPACE, fake_machine(cores=8)).baseline_params()
    assert params == {"backend": "eager", "eager.precision": "fp32", "batch_size": 8, "allocator": "glibc",
                      "instances": 1, "threads_per_instance": 8, "eager.memory_format": "contiguous"}


def test_explicit_thread_lists_never_launch_what_does_not_fit():
    space = SearchSpace.from_dict({**SPACE, "instances": [1, 2], "threads_per_instance": [2, 4]}, fake_machine(cores=4))
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
    pairs = {(p["backend"], p[f"{p['backend']}.precision"]) for p in SearchSpace.from_dict(SPACE, fake_machine(cores=8)).coverage_params()}
    assert pairs == {("eager", "fp32"), ("eager", "bf16"), ("inductor", "fp32")}


def test_baseline_batch_must_be_in_the_space():
    with pytest.raises(UserError, match="baseline batch_size 3"):
        SearchSpace.from_dict({**SPACE, "baseline": {"batch_size": 3}}, fake_machine())
    with pytest.raises(UserError, match="'baseline' must be a mapping"):
        SearchSpace.from_dict({**SPACE, "baseline": 5}, fake_machine())

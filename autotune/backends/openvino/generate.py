"""OpenVINO as a generation backend: the model exported once per weight format by optimum-intel (a stateful
IR, weights compressed by NNCF: ir_export.py), then run in the trial's own process by openvino-genai's
LLMPipeline on the CPU plugin, as OpenVINO GenAI's own benchmark runs it: one batch of `sequences` prompts
(token ids), greedy decoding of exactly `new_tokens` tokens, a stamp per token from GenAI's own record, so
TTFT, TPOT and tokens/s mean what they mean for the other backends.

The drift pass needs logits, which the pipeline does not return: it drives the same IR with the same plugin
settings through one stateful infer request (as optimum-intel's `generate` does), to which autotune adds
one input, how many of the last positions reach the output layer: the compared positions, then one per
decode step, fed FP32's greedy tokens.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.backends.base import BackendOptions, BackendSpec, choice, import_failure
from autotune.backends.generation import sensitivity
from autotune.backends.openvino import ir_export
from autotune.backends.precision import ExecutedPrecision, bucket_of, judge, judge_mix
from autotune.common.cpuinfo import bf16_tiles

if TYPE_CHECKING:
    from autotune.backends.base import BackendConfig

PRECISIONS = tuple(ir_export.WEIGHT_FORMATS)
# The type a mix keeps its sensitive matrices in: fp16 under int8, int8 under int4.
KEPT_TYPES = {"int8_asym": "fp16", "int4_sym": "int8_asym", "int4_asym": "int8_asym"}
KEEP_INPUT = "logits_to_keep"


@dataclass(frozen=True)
class OpenVinoGenerateOptions(BackendOptions):
    inference_precision: str = choice("f32", "bf16")  # the CPU plugin's activations (bf16 where the CPU has it)
    kv_cache_precision: str = choice("u8", "f16", "f32")  # the CPU plugin's default is u8
    # activations quantized per group for int weights: the plugin does so for int weights only, so fp16/fp32
    # trials would repeat themselves
    dynamic_quantization_group_size: int = choice(32, 0, 128, precisions=("int8_asym", *ir_export.INT4))
    group_size: int = choice(128, 64, 32, precisions=ir_export.INT4)  # NNCF's int4 group
    ratio: float = choice(1.0, 0.8, precisions=ir_export.INT4)  # share of the matrices in int4 (the rest int8)
    # the share of the blocks' weights (least sensitive matrices first, generation/sensitivity.py) in the IR's
    # type, the rest in the type above it (KEPT_TYPES), written by NNCF with the kept matrices as its ignored
    # scope; 1 = optimum-cli's whole-model export. Never sampled: the mix search bisects for it
    compressed_share: float = choice(*sensitivity.SHARES, precisions=tuple(KEPT_TYPES))
    # NNCF's data-aware int4 (ir_export.DATA_AWARE) on the calibration text: the user's own, through the IR
    data_aware: str = choice("none", *ir_export.DATA_AWARE, precisions=ir_export.INT4)
    # the u8 KV cache's quantization groups along each head (KEY_CACHE_GROUP_SIZE and VALUE_CACHE_GROUP_SIZE);
    # 0: the plugin's own (one group per head); refused with another KV precision, where it does nothing
    kv_cache_group_size: int = choice(0, 32, 64, 16)
    # GenAI's continuous-batching scheduler: the most tokens one step computes (0: no cap, as benchmark_genai
    # runs), and whether a step fuses prompt chunks with the running sequences' decode tokens (split-fuse) or
    # prefills whole prompts apart; with the cap, a batch's prompts are prefilled in several steps
    max_num_batched_tokens: int = choice(0, 2048, 512, 256, scheduling=True)  # 256: GenAI's own server default
    dynamic_split_fuse: bool = choice(True, False, scheduling=True)
    # the server scenario's sequences at once (max_num_seqs), apart from the offline batch its drift and window
    # run: 0 = that batch's sequences; 256 = GenAI's own default
    server_sequences: int = choice(0, 256, 128, 64, 32, 16, 8, scheduling=True)
    # the server scenario's pipelines behind the one arrival stream, each in its own process pinned to its
    # share of the instance's cores (serving.GenAiServerPool); 1: one pipeline on all of them
    server_instances: int = choice(1, 2, 4, scheduling=True)


SPEC = BackendSpec(
    name="openvino",
    description="OpenVINO GenAI: the model exported by optimum-intel, weights compressed by NNCF",
    precisions=PRECISIONS,
    task="generate",
    options=OpenVinoGenerateOptions,
    requires=("openvino", "openvino_genai"),
    packages=("openvino", "nncf"),
    probe_environment=(ir_export.OVERLAY_ENV,),
    complexity=4,
    prepare_cost=2,
    runtime_hint="make setup installs openvino-genai",
    uses_artifact=True,
    # as for classification (openvino/classify.py): oneTBB's DEEPBIND frees with glibc what a preloaded
    # allocator handed out, and compiling the IR aborts (free(): invalid pointer) without this setting
    preloaded_allocator_env=(("TBB_ENABLE_SANITIZERS", "1"),),
    kept_types=tuple(KEPT_TYPES.items()),
)
ARTIFACT_VERSION = 1


# OpenVINO GenAI 2026.4.1's LLMPipeline dies of SIGFPE while it compiles an fp16 IR with bf16 activations on
# one thread (an instance of one thread, pinned to one CPU): every sequence count, with or without the KV
# cache and dynamic quantization settings, on a Xeon with AMX; on two threads, and for int8 and int4 IRs, it
# runs; on an AMD EPYC Zen 4 (AVX512-BF16, no AMX) it runs on one thread too. Refused where the CPU has AMX
# (tests/test_openvino_generation.py runs the crash there, and the run elsewhere).
FP16_BF16_ONE_CPU = (
    "fp16 weights with bf16 activations on one thread of a CPU with AMX: OpenVINO GenAI's pipeline dies of "
    "SIGFPE compiling them (2026.4.1); f32 activations, or two threads per instance, run"
)


def unavailable() -> str | None:
    """Why OpenVINO cannot run text generation here (GenAI or its exporter missing), or None."""
    return import_failure(SPEC) or ir_export.exporter_missing()


def unsupported(config: BackendConfig) -> str | None:
    """A bf16 hint the CPU plugin cannot honour compiles f32: the trial would repeat the f32 one; so would KV
    groups for a cache in f16 or f32, and split-fuse on or off without a cap (every prompt in one step)."""
    options = OpenVinoGenerateOptions.of(config)
    share = float(options.compressed_share)
    refusal = sensitivity.share_refusal(share, config.precision, KEPT_TYPES)
    if refusal:
        return refusal
    if options.data_aware != "none" and config.precision not in ir_export.INT4:
        return f"NNCF's data-aware algorithms ({options.data_aware}) compress int4 weights; {config.precision} is not"
    if share != 1.0 and float(options.ratio) != 1.0:
        return "compressed_share and ratio are two mixes: NNCF's ratio ranks by its own metric; choose one"
    if options.inference_precision == "bf16":
        offered = plugin_capabilities()
        if "BF16" not in offered:
            return f"the CPU plugin offers no bf16 here (its capabilities: {' '.join(offered)})"
        if config.precision == "fp16" and config.threads_per_instance == 1 and bf16_tiles():
            return FP16_BF16_ONE_CPU
    if options.kv_cache_group_size and options.kv_cache_precision != "u8":
        return f"KV cache groups quantize a u8 cache: a {options.kv_cache_precision} cache has none"
    if not options.dynamic_split_fuse and not options.max_num_batched_tokens:
        return "split-fuse off changes nothing without a max_num_batched_tokens cap"
    if int(options.server_instances) > max(1, int(config.threads_per_instance)):
        return (
            f"{options.server_instances} server instances need a thread each; the trial has "
            f"{config.threads_per_instance}"
        )
    return None


@functools.cache
def plugin_capabilities() -> tuple[str, ...]:
    """What OpenVINO's CPU plugin can run on this machine (FP32, BF16, INT8, ...), asked once."""
    import openvino as ov

    return tuple(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def artifact_identity(config: BackendConfig) -> dict[str, Any]:
    """The IR depends on its weight format (and int4's group and ratio) and the exporter's versions, not on
    the runtime's hints."""
    identity: dict[str, Any] = {
        "task": "generate",
        "precision": config.precision,
        "exporter": ir_export.exporter_version(),
    }
    options = OpenVinoGenerateOptions.of(config)
    if config.precision in ir_export.INT4:
        identity.update(group_size=int(options.group_size), ratio=float(options.ratio))
    share = float(options.compressed_share)
    if share != 1.0:
        identity.update(compressed_share=share, sensitivity=sensitivity.METHOD_ID)
    if config.precision in ir_export.INT4 and options.data_aware != "none":
        identity["data_aware"] = str(options.data_aware)
    return identity


def build_artifact(model: Any, calibration: Any, config: BackendConfig, out_dir: Path) -> dict[str, Any]:
    """Export (and compress) once into out_dir; returns what was done. A mix ranks the model's matrices on
    the calibration text first (generation/sensitivity.py) and keeps the most sensitive in the wider type."""
    import openvino as ov

    options = OpenVinoGenerateOptions.of(config)
    share = float(options.compressed_share)
    data_aware = str(options.data_aware) if config.precision in ir_export.INT4 else "none"
    mixed: dict[str, Any] = {}
    kept: tuple[str, ...] = ()
    if (share != 1.0 or data_aware != "none") and calibration is None:
        raise ValueError("a mix or data-aware int4 needs the calibration text")
    if share != 1.0:
        int4 = config.precision in ir_export.INT4
        fmt = sensitivity.WeightFormat(4, int(options.group_size), config.precision == "int4_sym") if int4 else None
        ranking = sensitivity.cached_ranking(model.eval(), calibration, config.precision, out_dir, fmt)
        kept = ranking.kept(share)
        mixed = ranking.mix_details(share, KEPT_TYPES[config.precision])
    if share != 1.0 or data_aware != "none":
        done = ir_export.export_compressed(
            model.eval(),
            config.precision,
            out_dir,
            int(options.group_size),
            float(options.ratio),
            kept,
            sensitivity.edge_layers(model),
            calibration,
            data_aware,
        )
    else:
        done = ir_export.export(model.eval(), config.precision, out_dir, int(options.group_size), float(options.ratio))
    ir = out_dir / ir_export.IR_FILE
    return {
        "precision": config.precision,
        "engine": f"OpenVINO {ov.__version__}",
        **done,
        **mixed,
        "weight_types": ir_export.weight_types(ir),
        "weight_bytes": ir.with_suffix(".bin").stat().st_size,
    }


def cached_artifact(artifact_dir: str | Path) -> dict[str, Any] | None:
    """The IR in `artifact_dir` with its build details, or None (not built, or evicted)."""
    from autotune.backends.generation.artifacts import engine_file

    return engine_file(artifact_dir, ir_export.IR_FILE)


def prepare(
    model: Any, config: BackendConfig, new_tokens: int, calibration: Any = None, artifact: dict[str, Any] | None = None
) -> tuple[OpenVinoGenerator, dict[str, Any]]:
    """Compile the IR the prepare step wrote (exported here when it was evicted since)."""
    from autotune.backends.generation.artifacts import engine_files

    def export(folder: Path) -> dict[str, Any]:
        return build_artifact(model, calibration, config, folder)

    with engine_files(artifact, export, "autotune-openvino-") as (folder, details):
        options = OpenVinoGenerateOptions.of(config)
        generator = OpenVinoGenerator(
            ir=folder / ir_export.IR_FILE,
            new_tokens=new_tokens,
            threads=max(1, int(config.threads_per_instance)),
            inference_precision=str(options.inference_precision),
            kv_cache_precision=str(options.kv_cache_precision),
            dynamic_quantization_group_size=int(options.dynamic_quantization_group_size),
            kv_cache_group_size=int(options.kv_cache_group_size),
            max_num_batched_tokens=int(options.max_num_batched_tokens),
            dynamic_split_fuse=bool(options.dynamic_split_fuse),
            server_instances=int(options.server_instances),
        )
        details["scheduler"] = generator.scheduler_settings
        details["drift_request_runtime"] = generator.runtime_properties()  # compiled while the IR is here
    generator.probe = ir_weight_probe(details["weight_types"], details)
    details["runner"] = generator.engine
    return generator, details


def with_logits_to_keep(model: Any) -> bool:
    """Give the IR an input that says how many of the last positions reach the output layer (a Slice
    before its MatMul); False when the logits do not come straight from one MatMul (all positions then)."""
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops

    head = model.output("logits").get_node()
    while head.get_type_name() in ("Result", "Convert"):
        head = head.input(0).get_source_output().get_node()
    if head.get_type_name() != "MatMul":
        return False
    hidden = head.input(0).get_source_output()
    keep = ops.parameter([1], ov.Type.i64, name=KEEP_INPUT)
    keep.output(0).get_tensor().set_names({KEEP_INPUT})
    last = ops.slice(
        hidden,
        ops.negative(keep),
        ops.constant(np.array([np.iinfo(np.int64).max])),
        ops.constant(np.array([1])),
        ops.constant(np.array([1])),
    )
    head.input(0).replace_source_output(last.output(0))
    model.add_parameters([keep])
    model.validate_nodes_and_infer_types()
    return True


@dataclass
class OpenVinoGenerator:
    """Greedy decoding of exactly `new_tokens` tokens for a batch of prompts by openvino-genai's
    LLMPipeline on the IR (the Generator's contract, decode_loop.py): its continuous-batching scheduler and
    paged attention, as OpenVINO GenAI's benchmark runs it; each token's stamp is the one GenAI records
    (its raw metrics' new-token times, on the monotonic clock autotune's call stamps use). The drift pass
    drives the same IR, compiled with the same plugin settings, through one stateful infer request that
    returns logits (GenAI's pipeline returns tokens only)."""

    ir: Path
    new_tokens: int
    threads: int
    inference_precision: str = "f32"
    kv_cache_precision: str = "u8"
    dynamic_quantization_group_size: int = 32
    kv_cache_group_size: int = 0  # 0: the plugin's own
    max_num_batched_tokens: int = 0  # 0: no cap
    dynamic_split_fuse: bool = True
    server_instances: int = 1  # the server scenario's pipelines (GenAiServerPool when more than one)
    token_stamps: array = field(default_factory=lambda: array("d"))
    probe: Any = None  # what the worker asks what runs: the IR's weight types (ir_weight_probe)

    def __post_init__(self) -> None:
        import openvino_genai

        properties = {
            "INFERENCE_NUM_THREADS": self.threads,
            "INFERENCE_PRECISION_HINT": self.inference_precision,
            "KV_CACHE_PRECISION": self.kv_cache_precision,
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": self.dynamic_quantization_group_size,
        }
        if self.kv_cache_group_size:
            properties["KEY_CACHE_GROUP_SIZE"] = properties["VALUE_CACHE_GROUP_SIZE"] = self.kv_cache_group_size
        scheduler = openvino_genai.SchedulerConfig()  # benchmark_genai's: no prefix cache, no token cap
        scheduler.enable_prefix_caching = False
        scheduler.max_num_batched_tokens = self.max_num_batched_tokens or sys.maxsize
        # GenAI asks for no more sequences than tokens per step (its default: 256 sequences)
        scheduler.max_num_seqs = min(scheduler.max_num_seqs, scheduler.max_num_batched_tokens)
        scheduler.dynamic_split_fuse = self.dynamic_split_fuse
        self._pipeline = openvino_genai.LLMPipeline(
            str(self.ir.parent), "CPU", scheduler_config=scheduler, **properties
        )
        self._config = openvino_genai.GenerationConfig()
        self._config.max_new_tokens = self.new_tokens
        self._config.min_new_tokens = self.new_tokens
        self._config.ignore_eos = True  # exactly new_tokens, as every backend decodes
        self._config.apply_chat_template = False
        self.engine = f"openvino-genai {openvino_genai.__version__} LLMPipeline"
        self._properties = properties
        self._compiled: Any = None
        self._request: Any = None
        self.sliced = False
        self.model = None  # no torch module: the probe reads the IR's weight types

    @property
    def scheduler_settings(self) -> dict[str, Any]:
        """What GenAI's scheduler was given (max_num_batched_tokens None: no cap)."""
        return {
            "max_num_batched_tokens": self.max_num_batched_tokens or None,
            "dynamic_split_fuse": self.dynamic_split_fuse,
            "kv_cache_group_size": self.kv_cache_group_size or "the plugin's",
        }

    def _drift_request(self) -> Any:
        """The stateful infer request the passes that need logits run, compiled on first use: a second copy
        of the weights, dropped when the timed calls begin (release_drift_request)."""
        if self._request is None:
            import openvino as ov

            core = ov.Core()
            model = core.read_model(self.ir)
            self.sliced = with_logits_to_keep(model)
            self._compiled = core.compile_model(model, "CPU", {**self._properties, "NUM_STREAMS": 1})
            self._request = self._compiled.create_infer_request()
        return self._request

    @contextlib.contextmanager
    def open_server(self, slots: int, context_tokens: int, folder: Path) -> Iterator[tuple[Any, bool]]:
        """The server scenario's engine: GenAI's ContinuousBatchingPipeline on this IR with the same plugin
        properties and scheduler settings, holding up to `slots` sequences at once (its KV cache grows as
        needed: `context_tokens` and `folder` are llama-server's concern); stepped in the caller's thread, or
        with server_instances, a pool of pipelines in their own processes, each pinned to its share of this
        process's CPUs and holding up to `slots` sequences."""
        from autotune.backends.openvino.serving import SchedulerSettings, open_genai_server

        if not self.ir.is_file():
            raise RuntimeError(f"the IR {self.ir} is gone (evicted from the cache): the server cannot load it")
        self.release_drift_request()
        scheduler = SchedulerSettings(
            max_num_seqs=slots,
            max_num_batched_tokens=self.max_num_batched_tokens,
            dynamic_split_fuse=self.dynamic_split_fuse,
        )
        properties = dict(self._properties)
        with open_genai_server(self.ir.parent, properties, scheduler, self.server_instances, self.threads) as server:
            yield server, False

    def release_drift_request(self) -> None:
        """Free the infer request's copy of the weights (compiled again if a later pass needs logits)."""
        self._request = None
        self._compiled = None

    def runtime_properties(self) -> dict[str, str]:
        """What the CPU plugin compiled the drift pass's infer request with (a bf16 hint on a CPU without
        bf16 reads f32 here); GenAI's pipeline gets the same hints but does not report what it compiled."""
        names = (
            "INFERENCE_PRECISION_HINT",
            "KV_CACHE_PRECISION",
            "DYNAMIC_QUANTIZATION_GROUP_SIZE",
            "INFERENCE_NUM_THREADS",
            "KEY_CACHE_GROUP_SIZE",
            "VALUE_CACHE_GROUP_SIZE",
        )
        self._drift_request()
        values = {name: self._compiled.get_property(name) for name in names}
        return {
            name: value.to_string() if hasattr(value, "to_string") else str(value) for name, value in values.items()
        }

    def generate(self, input_ids: Any, stamp: bool = True) -> Any:
        """The new tokens (batch x new_tokens) from GenAI's pipeline; with `stamp`, each token's time
        (GenAI's own record of when the step that made it ended) is appended to token_stamps."""
        import numpy as np
        import openvino as ov
        import openvino_genai
        import torch

        if stamp:  # the timed calls: the drift pass is done, its weights need not stay resident
            self.release_drift_request()
        ids = np.ascontiguousarray(input_ids.numpy() if hasattr(input_ids, "numpy") else input_ids, np.int64)
        inputs = openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        result = self._pipeline.generate(inputs, self._config)
        tokens = np.array(result.tokens, np.int64).reshape(ids.shape[0], self.new_tokens)
        if stamp:
            times = list(result.perf_metrics.raw_metrics.m_new_token_times)  # milliseconds, steady clock
            # GenAI records every step that made a token. With a cap on a step's tokens, a batch's prompts are
            # prefilled over several steps and its sequences get their first tokens on different steps: the
            # last new_tokens steps are those at which every sequence had its first, second, ... token
            staggered = len(times) - self.new_tokens
            if staggered < 0 or (staggered and not self.max_num_batched_tokens):
                raise RuntimeError(f"openvino-genai recorded {len(times)} token times for {self.new_tokens} tokens")
            self.token_stamps.extend(t / 1e3 for t in times[staggered:])
        return torch.from_numpy(tokens)

    def generate_with_logits(self, input_ids: Any, positions: int, forced: Any = None) -> tuple[Any, Any]:
        """The new tokens and the float32 next-token logits at the prompt's last `positions` and at every
        decode step (the stateful infer request); with `forced`, each decode step is fed the forced token
        of the step before."""
        return self._generate(input_ids, stamp=False, keep_logits=positions, forced=forced)

    def _infer(self, ids: Any, past: int, keep: int) -> Any:
        """One call on `ids` (batch x tokens) after `past` cached positions; the last `keep` positions'
        logits (batch x keep x vocab, a copy)."""
        import numpy as np

        sequences, tokens = ids.shape
        feed = {
            "input_ids": ids,
            "attention_mask": np.ones((sequences, past + tokens), np.int64),
            "position_ids": np.broadcast_to(np.arange(past, past + tokens, dtype=np.int64), (sequences, tokens)),
            "beam_idx": np.arange(sequences, dtype=np.int32),
        }
        if self.sliced:
            feed[KEEP_INPUT] = np.array([keep], np.int64)
        logits = self._drift_request().infer(feed)["logits"]
        return np.array(logits[:, -keep:], np.float32)

    def decode_steps(self, input_ids: Any) -> Any:
        """Greedy tokens through the infer request alone (the drift pass's path), stamped like generate."""
        return self._generate(input_ids, stamp=True, keep_logits=0)[0]

    def _generate(self, input_ids: Any, stamp: bool, keep_logits: int, forced: Any = None) -> tuple[Any, Any]:
        import numpy as np
        import torch

        ids = np.ascontiguousarray(input_ids.numpy() if hasattr(input_ids, "numpy") else input_ids, np.int64)
        sequences, prompt = ids.shape
        kept: list[Any] | None = [] if keep_logits else None
        self._drift_request().reset_state()
        logits = self._infer(ids, 0, max(keep_logits, 1))
        if kept is not None:
            kept.append(logits)
        tokens = np.empty((sequences, self.new_tokens), np.int64)
        tokens[:, 0] = logits[:, -1].argmax(axis=1)
        if stamp:
            self.token_stamps.append(time.monotonic())
        forced_ids = None if forced is None else (forced.numpy() if hasattr(forced, "numpy") else forced)
        for step in range(1, self.new_tokens):
            fed = tokens[:, step - 1] if forced_ids is None else forced_ids[:, step - 1]
            logits = self._infer(np.ascontiguousarray(fed, np.int64)[:, None], prompt + step - 1, 1)
            if kept is not None:
                kept.append(logits)
            tokens[:, step] = logits[:, -1].argmax(axis=1)
            if stamp:
                self.token_stamps.append(time.monotonic())
        return torch.from_numpy(tokens), None if kept is None else torch.from_numpy(np.concatenate(kept, axis=1))


def ir_weight_probe(
    weight_types: dict[str, int], details: dict[str, Any] | None = None
) -> Callable[[Any, str], ExecutedPrecision]:
    """An OpenVINO IR's probe: its matrix products by weight type (NNCF's u8/i4 constants; no call),
    counted over every one, so NNCF keeping a matrix it cannot group in int8 is seen. A mix (build details
    with `kept_layers`) holds when the IR holds exactly the mix asked (judge_mix)."""
    counts: Counter[str] = Counter()
    for name, n in weight_types.items():
        counts[bucket_of(name)] += n
    if details and "kept_layers" in details:
        return lambda native_input, claimed: judge_mix(claimed, dict(counts), "IR weight types", details)
    return lambda native_input, claimed: judge(claimed, {"IR weight types": dict(counts)}, most=True)

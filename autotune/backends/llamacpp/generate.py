"""llama.cpp as a generation backend: the model converted once per GGUF type by llama.cpp's own converter
and quantizer (gguf_export.py), then run in the trial's own process through llama-cpp-python's low-level
API (the C functions llama-batched-bench calls): one batch of `sequences` prompts, each its own sequence
of the KV cache, then greedy decoding of exactly `new_tokens` tokens with a stamp per token, so TTFT, TPOT
and tokens/s mean what they mean for the PyTorch backends.

A timed prefill asks for the logits of each prompt's last position only (as llama.cpp's tools do); the
drift pass asks for the compared positions and every decode step, fed FP32's greedy tokens.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.backends.base import BackendOptions, BackendSpec, choice, import_failure
from autotune.backends.generation import sensitivity
from autotune.backends.llamacpp import gguf_export
from autotune.backends.precision import ExecutedPrecision, bucket_of, judge, judge_mix

if TYPE_CHECKING:
    from autotune.backends.base import BackendConfig

# GGUF types, as llama.cpp names them (upper case: not the PyTorch backends' precisions).
PRECISIONS = ("F32", "BF16", "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q2_K")
GGUF_FILE = "model.gguf"
# llama.cpp's AMX weight buffers crash llama_decode with SIGSEGV in ggml_backend_amx_mul_mat (llama.cpp issue
# 20824, open): on an AMX Xeon, Q4_0 and Q8_0 crashed at 64 and 768 wide, BF16 (not held in them) ran. A build
# whose system info names AMX_INT8 loads without llama.cpp's extra weight buffers (`use_extra_bufts` turns the
# AMX and the repacked ones off together); elsewhere they stay on (an Ice Lake Xeon ran 64-2048 wide with them).
AMX_BUILD = "AMX_INT8 = 1"

KV_CACHE_TYPES = {"f16": 1, "q8_0": 8}  # ggml_type of the K and V caches
# The type a mix keeps its sensitive matrices in: 16 bits over 8, 8 over fewer.
# The types llama.cpp's quantizer rounds with an importance matrix (Q8_0 has one rounding only).
IMATRIX_TYPES = ("Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q2_K")
KEPT_TYPES = {"Q8_0": "F16", "Q6_K": "Q8_0", "Q5_K_M": "Q8_0", "Q4_K_M": "Q8_0", "Q4_0": "Q8_0", "Q2_K": "Q8_0"}


@dataclass(frozen=True)
class LlamaCppOptions(BackendOptions):
    # how the tokens are batched, never which kernels or types run: a fallback found once holds for all
    n_batch: int = choice(2048, 512, scheduling=True)  # tokens per llama_decode call (a longer prompt in chunks)
    n_ubatch: int = choice(512, 256, 128, scheduling=True)  # tokens per physical compute batch
    flash_attn: bool = choice(True, False)
    kv_cache_type: str = choice(*KV_CACHE_TYPES)
    # llama.cpp's extra weight buffers (`use_extra_bufts`: the weights repacked for this CPU's kernels, and AMX's):
    # auto = on, as in llama.cpp's tools, but off on a build with AMX, whose buffers crash llama_decode (there
    # "off" is the same load, refused); off = the weights as the GGUF holds them
    repack: str = choice("auto", "off")
    # threads of a one-sequence decode step (llama.cpp's n_threads, which it uses for a batch of one token): all
    # the instance's, or half (the prompt's prefill, and a step of several sequences, take n_threads_batch: all);
    # a memory-bound step may not scale to every thread
    decode_threads: str = choice("all", "half", scheduling=True)
    # the server scenario's slots (llama-server's -np), apart from the offline batch its drift and window run:
    # 0 = that batch's sequences; 4 = llama-server's own (-np auto)
    server_sequences: int = choice(0, 4, 8, 16, 32, 64, scheduling=True)
    # the share of the blocks' weights (least sensitive matrices first, generation/sensitivity.py) in the file's
    # type; the rest, the output layer and the token embedding in the type above it (KEPT_TYPES): 1 = the
    # whole-model type as llama.cpp's quantizer writes it. Never sampled: the mix search bisects for the largest
    # share within the quality bound (tuning/mix_search.py)
    compressed_share: float = choice(*sensitivity.SHARES, precisions=tuple(KEPT_TYPES))
    # llama.cpp's importance matrix (`llama-imatrix`, then `llama-quantize --imatrix`): each Linear's mean
    # squared input per column over the calibration text, from one FP32 forward in PyTorch, so the quantizer
    # weighs each column's rounding error by how much it reaches the output; the text is the user's
    imatrix: bool = choice(False, True, precisions=IMATRIX_TYPES)


SPEC = BackendSpec(
    name="llamacpp",
    description="llama.cpp (llama-cpp-python): the model converted to GGUF by llama.cpp's converter",
    precisions=PRECISIONS,
    task="generate",
    options=LlamaCppOptions,
    requires=("llama_cpp",),
    packages=("llama_cpp_python",),
    complexity=6,
    # a GGUF conversion (and a quantization from it), no compile: a trial of the 105M decoder prepared in 7.4 s
    # with its GGUF cached; after OpenVINO's export, before IPEX's optimize and inductor's compile
    prepare_cost=3,
    runtime_hint="make setup builds llama-cpp-python",
    probe_environment=(gguf_export.CONVERTER_ENV,),
    uses_artifact=True,
    kept_types=tuple(KEPT_TYPES.items()),
)
ARTIFACT_VERSION = 1


def unavailable() -> str | None:
    """Why llama.cpp cannot run in this runtime (not installed, or its converter missing), or None."""
    return import_failure(SPEC) or gguf_export.converter_missing()


def unsupported(config: BackendConfig) -> str | None:
    """A quantized V cache needs flash attention in llama.cpp; n_ubatch cannot exceed n_batch; half the decode
    threads and repack off are refused where they would repeat another trial."""
    options = LlamaCppOptions.of(config)
    if options.kv_cache_type != "f16" and not options.flash_attn:
        return "llama.cpp quantizes the V cache only with flash attention"
    if int(options.n_ubatch) > int(options.n_batch):
        return "n_ubatch cannot exceed n_batch"
    if options.decode_threads == "half" and (int(config.batch_size) > 1 or int(config.threads_per_instance) < 2):
        return (
            "decode threads half changes nothing here: llama.cpp takes all for a step of several sequences, "
            "and half of one thread is one"
        )
    refusal = sensitivity.share_refusal(float(options.compressed_share), config.precision, KEPT_TYPES)
    if refusal:
        return refusal
    if options.imatrix and config.precision not in IMATRIX_TYPES:
        return f"llama.cpp's quantizer uses an importance matrix for {', '.join(IMATRIX_TYPES)} only"
    if options.repack == "off" and amx_build():
        return (
            "repack off is repack auto here: this llama.cpp build has AMX, so its extra weight buffers are off already"
        )
    return None


@functools.cache
def amx_build() -> bool:
    """Whether this runtime's llama.cpp was built with AMX kernels (its system info says AMX_INT8)."""
    return AMX_BUILD in LlamaCppGenerator.system_info()


def artifact_identity(config: BackendConfig) -> dict[str, Any]:
    """The GGUF depends on its type, its mix and the converter's release (not threads, batches, attention or
    the KV cache); a mix also on the calibration text, which the artifact key holds."""
    identity: dict[str, Any] = {
        "task": "generate",
        "precision": config.precision,
        "converter": gguf_export.converter_version(),
    }
    options = LlamaCppOptions.of(config)
    share = float(options.compressed_share)
    if share != 1.0:
        identity.update(compressed_share=share, sensitivity=sensitivity.METHOD_ID)
    if options.imatrix:
        identity["imatrix"] = sensitivity.IMATRIX_ID
    return identity


def build_artifact(model: Any, calibration: Any, config: BackendConfig, out_dir: Path) -> dict[str, Any]:
    """Convert (and quantize) once into out_dir/model.gguf; returns what was done. A mix ranks the model's
    matrices on the calibration text first and keeps the most sensitive in the wider type."""
    import llama_cpp

    options = LlamaCppOptions.of(config)
    share = float(options.compressed_share)
    mixed: dict[str, Any] = {}
    mix = None
    importance = None
    if options.imatrix:
        if calibration is None:
            raise ValueError("an importance matrix needs the calibration text")
        importance = sensitivity.input_energy(model.eval(), calibration)
        mixed["imatrix"] = f"{sensitivity.IMATRIX_METHOD}: {len(importance)} matrices, {calibration.numel()} tokens"
    if share != 1.0:
        if calibration is None:
            raise ValueError("a mix (compressed_share below 1) needs the calibration text to rank the layers")
        ranking = sensitivity.cached_ranking(model.eval(), calibration, config.precision, out_dir)
        mix = gguf_export.Mix(ranking.kept(share), KEPT_TYPES[config.precision])
        mixed |= ranking.mix_details(share, mix.kept_type)
    done = gguf_export.convert(model.eval(), config.precision, out_dir / GGUF_FILE, mix, importance)
    if mix is not None:  # tied embeddings: no output matrix of its own beside the kept ones
        mixed["output_matrices"] = gguf_export.output_matrices(out_dir / GGUF_FILE)
    return {
        "precision": config.precision,
        "engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})",
        **done,
        **mixed,
        "tensor_types": gguf_export.tensor_types(out_dir / GGUF_FILE),
        "weight_bytes": (out_dir / GGUF_FILE).stat().st_size,
    }


def cached_artifact(artifact_dir: str | Path) -> dict[str, Any] | None:
    """The GGUF in `artifact_dir` with its build details, or None (not built, or evicted)."""
    from autotune.backends.generation.artifacts import engine_file

    return engine_file(artifact_dir, GGUF_FILE)


def prepare(
    model: Any, config: BackendConfig, new_tokens: int, calibration: Any = None, artifact: dict[str, Any] | None = None
) -> tuple[LlamaCppGenerator, dict[str, Any]]:
    """Load the GGUF the prepare step wrote (converted here when it was evicted since)."""
    from autotune.backends.generation.artifacts import engine_files

    def convert(folder: Path) -> dict[str, Any]:
        return build_artifact(model, calibration, config, folder)

    with engine_files(artifact, convert, "autotune-llamacpp-") as (folder, details):
        options = LlamaCppOptions.of(config)
        generator = LlamaCppGenerator(
            gguf=folder / GGUF_FILE,
            new_tokens=new_tokens,
            threads=max(1, int(config.threads_per_instance)),
            n_batch=int(options.n_batch),
            n_ubatch=int(options.n_ubatch),
            flash_attn=bool(options.flash_attn),
            kv_cache_type=str(options.kv_cache_type),
            repack=str(options.repack) == "auto",
            decode_threads=str(options.decode_threads),
        )
    generator.probe = gguf_probe(details["tensor_types"], details)  # read off the file by build_artifact
    details["llama_cpp_system_info"] = generator.system_info()
    details["extra_weight_buffers"] = (
        "on"
        if generator.extra_buffers
        else "off: this llama.cpp build has AMX, whose buffers crash llama_decode"
        if generator.repack
        else "off (repack off)"
    )
    details["threads"] = {"prefill": generator.threads, "decode": generator.decode_thread_count}
    return generator, details


_LOG_STATE = {"level": 0}
_LOG_CALLBACK: Any = None  # one C callback for the process, never freed: llama.cpp keeps its pointer


def _quiet_log(level: int, text: bytes, user_data: Any) -> None:
    """llama.cpp's log callback: its load and context messages are dropped, errors kept on stderr (a
    continuation fragment, level 5, follows the level of the message it continues)."""
    if level != 5:  # GGML_LOG_LEVEL_CONT
        _LOG_STATE["level"] = level
    if _LOG_STATE["level"] == 4:  # GGML_LOG_LEVEL_ERROR
        import sys

        sys.stderr.write(text.decode(errors="replace"))


def _install_quiet_log() -> None:
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        import llama_cpp

        _LOG_CALLBACK = llama_cpp.llama_log_callback(_quiet_log)
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


@dataclass
class LlamaCppGenerator:
    """Greedy decoding of exactly `new_tokens` tokens for a batch of prompts through llama.cpp's C API,
    one KV-cache sequence per prompt, stamping each token (the Generator's contract, decode_loop.py)."""

    gguf: Path
    new_tokens: int
    threads: int
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: bool = True
    kv_cache_type: str = "f16"
    repack: bool = True  # llama.cpp's extra weight buffers, where the build has no AMX
    decode_threads: str = "all"  # or "half": a decode step's threads
    token_stamps: array = field(default_factory=lambda: array("d"))
    _model: Any = None
    _contexts: dict[tuple[int, int], Any] = field(default_factory=dict)
    probe: Any = None  # what the worker asks what runs: the GGUF's tensor types (gguf_probe)

    def __post_init__(self) -> None:
        import llama_cpp

        _install_quiet_log()
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        self.extra_buffers = self.repack and AMX_BUILD not in self.system_info()
        params.use_extra_bufts = self.extra_buffers
        self._model = llama_cpp.llama_model_load_from_file(str(self.gguf).encode(), params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {self.gguf}")
        self.vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model))
        self.model = None  # no torch module: the probe reads the GGUF's tensor types

    @property
    def decode_thread_count(self) -> int:
        """Threads of a decode step: the instance's, or half of them."""
        return self.threads if self.decode_threads == "all" else max(1, self.threads // 2)

    @contextlib.contextmanager
    def open_server(self, slots: int, context_tokens: int, folder: Path) -> Iterator[tuple[Any, bool]]:
        """The server scenario's engine: llama-server on this GGUF with the same batch, flash-attention, KV
        cache type, threads and weight repacking, `slots` slots sharing one KV cache of `context_tokens`
        tokens; its socket and log in `folder`, and it is stopped when the block ends."""
        from autotune.backends.llamacpp.server import LlamaServer, LlamaServerSettings

        settings = LlamaServerSettings(
            slots=slots,
            context=context_tokens,
            batch=self.n_batch,
            ubatch=self.n_ubatch,
            flash_attn="on" if self.flash_attn else "off",
            cache_type=self.kv_cache_type,
            threads=self.decode_thread_count,
            threads_batch=self.threads,
            unified_kv=True,
            repack=self.extra_buffers,
        )
        with LlamaServer(self.gguf, settings, folder) as server:
            yield server, True

    @staticmethod
    def system_info() -> str:
        import llama_cpp

        return str(llama_cpp.llama_print_system_info().decode(errors="replace")).strip()

    def close(self) -> None:
        """Free the contexts (their KV caches) and the weights llama.cpp holds outside Python's heap."""
        import llama_cpp

        self._free_contexts()
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the process's memory goes with it
            pass

    def _free_contexts(self) -> None:
        import llama_cpp

        for context, batch in self._contexts.values():
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(context)
        self._contexts.clear()

    def _context(self, sequences: int, length: int) -> Any:
        """The context of this shape (sequences x prompt + new tokens), its KV cache cleared between calls;
        one at a time: the drift pass's shape's cache is freed before the timed calls' is allocated."""
        import llama_cpp

        key = (sequences, length)
        if key not in self._contexts:
            self._free_contexts()
            params = llama_cpp.llama_context_default_params()
            params.n_ctx = sequences * length
            params.n_batch = self.n_batch
            params.n_ubatch = min(self.n_ubatch, self.n_batch)
            params.n_seq_max = sequences
            params.n_threads = self.decode_thread_count
            params.n_threads_batch = self.threads
            params.flash_attn_type = (
                llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
            params.type_k = params.type_v = KV_CACHE_TYPES[self.kv_cache_type]
            params.no_perf = True
            context = llama_cpp.llama_init_from_model(self._model, params)
            if not context:
                raise RuntimeError(f"llama.cpp could not create a context for {sequences} x {length} tokens")
            self._contexts[key] = (context, llama_cpp.llama_batch_init(max(self.n_batch, sequences), 0, 1))
        context, batch = self._contexts[key]
        # the cells' metadata only, as llama-batched-bench clears it: zeroing the buffers is timed work
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(context), False)
        return context, batch

    def _decode(self, context: Any, batch: Any, tokens: list[tuple[int, int, int, bool]]) -> Any:
        """One llama_decode of (token, position, sequence, wants logits) rows; returns the logits of the
        rows that want them, in order (a numpy view, valid until the next decode)."""
        import llama_cpp
        import numpy as np

        for i, (token, position, sequence, wants) in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = sequence
            batch.logits[i] = wants
        batch.n_tokens = len(tokens)
        code = llama_cpp.llama_decode(context, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code} for a batch of {len(tokens)} tokens")
        outputs = sum(1 for row in tokens if row[3])
        if not outputs:
            return None
        pointer = llama_cpp.llama_get_logits(context)
        return np.ctypeslib.as_array(pointer, shape=(outputs * self.vocab,)).reshape(outputs, self.vocab)

    def generate(self, input_ids: Any, stamp: bool = True) -> Any:
        """The new tokens (batch x new_tokens); with `stamp`, each token's time is appended to token_stamps."""
        return self._generate(input_ids, stamp, keep_logits=0)[0]

    def generate_with_logits(self, input_ids: Any, positions: int, forced: Any = None) -> tuple[Any, Any]:
        """The new tokens and the float32 next-token logits at the prompt's last `positions` and at every
        decode step; with `forced`, each decode step is fed the forced token of the step before."""
        return self._generate(input_ids, stamp=False, keep_logits=positions, forced=forced)

    def _generate(self, input_ids: Any, stamp: bool, keep_logits: int, forced: Any = None) -> tuple[Any, Any]:
        import numpy as np
        import torch

        ids = input_ids.numpy() if hasattr(input_ids, "numpy") else np.asarray(input_ids)
        sequences, prompt = ids.shape
        context, batch = self._context(sequences, prompt + self.new_tokens)
        wanted = max(keep_logits, 1)
        kept = np.empty((sequences, keep_logits + self.new_tokens - 1, self.vocab), np.float32) if keep_logits else None
        last = np.empty((sequences, self.vocab), np.float32)
        rows = [
            (int(ids[s, p]), p, s, p >= prompt - wanted) for s in range(sequences) for p in range(prompt)
        ]  # sequence by sequence, as llama-batched-bench feeds them
        for start in range(0, len(rows), self.n_batch):
            chunk = rows[start : start + self.n_batch]
            logits = self._decode(context, batch, chunk)
            out = 0
            for _token, position, sequence, wants in chunk:
                if not wants:
                    continue
                if kept is not None:
                    kept[sequence, position - (prompt - keep_logits)] = logits[out]
                if position == prompt - 1:
                    last[sequence] = logits[out]
                out += 1
        tokens = np.empty((sequences, self.new_tokens), np.int64)
        tokens[:, 0] = last.argmax(axis=1)
        if stamp:
            self.token_stamps.append(time.monotonic())
        forced_ids = None if forced is None else (forced.numpy() if hasattr(forced, "numpy") else forced)
        for step in range(1, self.new_tokens):
            fed = tokens[:, step - 1] if forced_ids is None else forced_ids[:, step - 1]
            logits = self._decode(context, batch, [(int(fed[s]), prompt + step - 1, s, True) for s in range(sequences)])
            if kept is not None:
                kept[:, keep_logits + step - 1] = logits
            tokens[:, step] = logits.argmax(axis=1)
            if stamp:
                self.token_stamps.append(time.monotonic())
        return torch.from_numpy(tokens), None if kept is None else torch.from_numpy(kept)


def gguf_probe(
    tensor_types: dict[str, int], details: dict[str, Any] | None = None
) -> Callable[[Any, str], ExecutedPrecision]:
    """A llama.cpp model's probe: the GGUF's matrices by type (no call), counted over every one, so a
    K-quant whose rows were too short for its blocks (a fallback to Q5_0 or Q8_0) is a fallback here too.
    A mix (build details with `kept_layers`) holds when the file holds exactly the mix asked (judge_mix)."""
    counts: Counter[str] = Counter()
    for name, n in tensor_types.items():
        counts[bucket_of(name)] += n
    if details and "kept_layers" in details:
        return lambda native_input, claimed: judge_mix(claimed, dict(counts), "GGUF tensor types", details)
    return lambda native_input, claimed: judge(claimed, {"GGUF tensor types": dict(counts)}, most=True)

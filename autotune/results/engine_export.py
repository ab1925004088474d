"""`autotune export --format llama-server | openvino-genai`: a study's best trial on one engine, written as
that engine's users deploy it: the artifact (the GGUF, or the IR folder with its tokenizer) beside best.json,
and the engine's own command with the settings the trial was timed with.

The trial is the engine's fastest clean one (completed within the drift bound, no noise flag) at the total
sequences of the study's winner, else at any total. Its threads, batch sizes, KV-cache type, flash attention,
pinning and environment (allocator, OpenMP) are what the script sets; one server per instance, each pinned
to its CPUs as in the trial.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.backends.llamacpp.generate import GGUF_FILE
from autotune.common.errors import UserError
from autotune.common.files import write_text_atomic
from autotune.measure.llm_load import RequestMix
from autotune.measure.llm_serving import LENGTH_SPREAD
from autotune.records.attributes import TrialAttrs
from autotune.records.config import TrialConfig
from autotune.results.selection import clean_trials, metrics_of, sequences_total
from autotune.runner.artifact_cache import META_FILE
from autotune.worker.llm_serve import served_sequences

if TYPE_CHECKING:
    import optuna

ENGINE_FORMATS = {"llama-server": "llamacpp", "openvino-genai": "openvino"}
LLAMA_SERVER_PORT = 8080  # llama-server's own default; instance i listens on 8080 + i
# the environment variables a trial sets that the engine's process reads (the allocator, OpenMP's runtime)
ENGINE_ENV_PREFIXES = ("LD_PRELOAD", "OMP_", "KMP_", "GOMP_", "MALLOC_CONF", "TCMALLOC_", "TBB_")


@dataclass(frozen=True)
class EngineTrial:
    """The trial an engine export reproduces, with what it ran and where its artifact lies."""

    number: int
    config: TrialConfig
    tokens_per_s: float
    sequences_total: int | None
    artifact_dir: Path
    env: dict[str, str]
    pin_prefixes: list[list[str]]
    prompt_tokens: int
    new_tokens: int
    # llama.cpp: whether the trial loaded the weights into its extra (repacked, AMX) buffers: off on a build
    # with AMX, whose buffers crash, and with repack off; the server loads them as the trial did
    repacked: bool = True
    # a server study's trial: the sequences its server held at once (GenAI's max_num_seqs, llama-server's slots),
    # and the tokens of the one KV cache they shared, each holding a longest request; None: an offline trial
    served_sequences: int | None = None
    served_context: int | None = None
    served_rps: float | None = None  # the highest request rate it sustained within the study's bounds

    @property
    def slots(self) -> int:
        """The sequences the exported engine holds at once: the served ones, else the offline batch."""
        return self.served_sequences or int(self.config.batch_size)


def best_engine_trial(study: optuna.study.Study, engine_format: str, winner_total: int | None) -> EngineTrial:
    """The engine's fastest clean trial (at the winner's total sequences when it has one there), or one line
    saying there is none."""
    backend = ENGINE_FORMATS[engine_format]
    mine = [t for t in clean_trials(study) if (c := TrialAttrs.of(t).config) is not None and c.backend == backend]
    if not mine:
        raise UserError(
            f"study {study.study_name!r} has no completed {backend} trial within the drift bound: nothing to export "
            f"as {engine_format} (autotune show lists its trials; a longer --budget, or a space listing {backend}, "
            "gives it one)"
        )
    at_total = [t for t in mine if sequences_total(t) == winner_total]
    trial = (at_total or mine)[0]  # best first
    attrs, metrics = TrialAttrs.of(trial), metrics_of(trial)
    if metrics.artifact is None or not Path(metrics.artifact.dir).is_dir():
        raise UserError(
            f"trial {trial.number}'s {backend} artifact is no longer in the cache "
            f"({metrics.artifact.dir if metrics.artifact else 'none recorded'}): run the same search again with "
            "--trials one more to rebuild it, or raise --cache-size"
        )
    job = attrs.job
    generation = job.generation if job else None
    if attrs.config is None or generation is None:
        raise UserError(f"trial {trial.number} is not a text-generation trial: nothing to export as {engine_format}")
    env = {k: v for k, v in (attrs.env or {}).items() if k.startswith(ENGINE_ENV_PREFIXES)}
    served = served_sequences(attrs.config) if metrics.llm_server else None
    return EngineTrial(
        number=trial.number,
        config=attrs.config,
        tokens_per_s=metrics.throughput_sps,
        sequences_total=sequences_total(trial),
        artifact_dir=Path(metrics.artifact.dir),
        env=env,
        pin_prefixes=attrs.pin_prefixes or [[] for _ in range(attrs.config.instances)],
        prompt_tokens=generation.prompt_tokens,
        new_tokens=generation.new_tokens,
        repacked=str((metrics.backend_details or {}).get("extra_weight_buffers", "on")).startswith("on"),
        served_sequences=served,
        served_rps=metrics.llm_server.sustained_rps if metrics.llm_server else None,
        served_context=(
            RequestMix(generation.prompt_tokens, generation.new_tokens, LENGTH_SPREAD).kv_context(served)
            if served is not None
            else None
        ),
    )


def _copy(source: Path, target: Path) -> None:
    """A hard link where the cache shares the file system (a GGUF or IR is hundreds of MB), else a copy."""
    target.unlink(missing_ok=True)
    try:
        target.hardlink_to(source)
    except OSError:
        shutil.copy2(source, target)


def _header(trial: EngineTrial, study: str, what: str) -> list[str]:
    c = trial.config
    return [
        "#!/usr/bin/env bash",
        f"# autotune export: study {study}, trial {trial.number} ({c.backend}/{c.precision}), {what}",
        f"# timed at {trial.tokens_per_s:.1f} generated tokens/s in all: {c.instances} instance(s) x "
        f"{c.batch_size} sequence(s) of {trial.prompt_tokens} prompt + {trial.new_tokens} new tokens, "
        f"{c.threads_per_instance} threads each",
        *(
            [
                f"# served at {trial.served_rps:.2f} requests/s sustained within the study's bounds (its search "
                f"measurement), {trial.served_sequences} sequences at once"
            ]
            if trial.served_rps is not None
            else []
        ),
        "set -euo pipefail",
        *(f"export {name}={shlex.quote(value)}" for name, value in sorted(trial.env.items())),
    ]


def llama_server_tool(prefix: str | Path = sys.prefix) -> str:
    """llama-server as `make llama-tools` builds it for this runtime, else the one on PATH."""
    built = Path(prefix) / "share" / "llama.cpp" / "bin" / "llama-server"
    return str(built) if built.is_file() else "llama-server"


def llama_server_arguments(trial: EngineTrial, gguf: Path, port: int) -> list[str]:
    """llama-server's flags for the trial: its threads (a decode step's and a batch's), one slot per sequence
    with the context each sequence used, batch and ubatch, flash attention, the KV cache's type, and the
    weight buffers as loaded."""
    c, o = trial.config, trial.config.options
    threads = int(c.threads_per_instance)
    decode = threads if o.get("decode_threads", "all") == "all" else max(1, threads // 2)
    kv = str(o.get("kv_cache_type", "f16"))
    # as a server trial ran: the slots share one cache of their longest requests; else a cache per sequence
    context = trial.served_context or -(-(trial.prompt_tokens + trial.new_tokens) // 256) * 256 * int(c.batch_size)
    args = [
        *("-m", str(gguf)),
        *("--threads", str(decode), "--threads-batch", str(threads)),
        *("--parallel", str(trial.slots), "--ctx-size", str(context)),
        *(("--kv-unified",) if trial.served_context else ()),
        *("--batch-size", str(o.get("n_batch", 2048)), "--ubatch-size", str(o.get("n_ubatch", 512))),
        *("--flash-attn", "on" if o.get("flash_attn", True) else "off"),
        *("--cache-type-k", kv, "--cache-type-v", kv),
        *("--host", "127.0.0.1", "--port", str(port)),
    ]
    if not trial.repacked:
        args.append("--no-repack")
    return args


def export_llama_server(study: optuna.study.Study, folder: Path, winner_total: int | None) -> list[Path]:
    """The GGUF as llama-server.gguf and llama-server.sh, which starts one tuned llama-server per instance."""
    trial = best_engine_trial(study, "llama-server", winner_total)
    folder.mkdir(parents=True, exist_ok=True)
    gguf = folder / "llama-server.gguf"
    _copy(trial.artifact_dir / GGUF_FILE, gguf)
    tool = llama_server_tool()
    lines = _header(trial, study.study_name, "as llama.cpp's llama-server")
    lines += [
        "# Usage: [PORT=N] ./llama-server.sh [MORE LLAMA-SERVER FLAGS]; instance i listens on port "
        f"PORT + i (default {LLAMA_SERVER_PORT}; OpenAI API: /v1/completions, /v1/chat/completions)",
        f"PORT=${{PORT:-{LLAMA_SERVER_PORT}}}",
        f"LLAMA_SERVER=${{LLAMA_SERVER:-{shlex.quote(tool)}}}",
        'here="$(cd "$(dirname "$0")" && pwd)"',
        "pids=()",
        "trap 'kill \"${pids[@]}\" 2>/dev/null' INT TERM",
    ]
    for i, prefix in enumerate(trial.pin_prefixes):
        args = llama_server_arguments(trial, Path("GGUF"), 0)
        words = shlex.join(args).replace("GGUF", '"$here/llama-server.gguf"', 1)
        words = words.replace("--port 0", f"--port $((PORT + {i}))")
        lines += [" ".join([*map(shlex.quote, prefix), '"$LLAMA_SERVER"', words, '"$@" &']), "pids+=($!)"]
    lines += ["status=0", 'for pid in "${pids[@]}"; do wait "$pid" || status=$?; done', 'exit "$status"', ""]
    script = write_text_atomic(folder / "llama-server.sh", "\n".join(lines), mode=0o755)
    return [gguf, script]


GENAI_RUNNER = '''"""OpenVINO GenAI on the IR beside this file, with the settings autotune timed."""

import json
import sys
from pathlib import Path

import openvino_genai

here = Path(__file__).resolve().parent
tuned = json.loads((here / "openvino-genai.json").read_text())
scheduler = openvino_genai.SchedulerConfig()
for name, value in tuned["scheduler"].items():
    setattr(scheduler, name, value)
ir = str(here / "openvino-genai")
pipeline = openvino_genai.LLMPipeline(ir, "CPU", scheduler_config=scheduler, **tuned["properties"])
config = openvino_genai.GenerationConfig(max_new_tokens=int(sys.argv[2]) if len(sys.argv) > 2 else 64)
print(pipeline.generate(sys.argv[1] if len(sys.argv) > 1 else "Hello", config))
'''


def genai_settings(trial: EngineTrial) -> dict[str, Any]:
    """The LLMPipeline's properties and SchedulerConfig fields the trial ran with (openvino/generate.py)."""
    o = trial.config.options
    # a server trial's pool (openvino/serving.GenAiServerPool): pipelines pinned apart, the threads dealt to them
    pipelines = int(o.get("server_instances", 1)) if trial.served_sequences else 1
    properties: dict[str, Any] = {
        "INFERENCE_NUM_THREADS": max(1, int(trial.config.threads_per_instance) // pipelines),
        "INFERENCE_PRECISION_HINT": str(o.get("inference_precision", "f32")),
        "KV_CACHE_PRECISION": str(o.get("kv_cache_precision", "u8")),
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": int(o.get("dynamic_quantization_group_size", 32)),
    }
    if int(o.get("kv_cache_group_size", 0)):
        properties["KEY_CACHE_GROUP_SIZE"] = properties["VALUE_CACHE_GROUP_SIZE"] = int(o["kv_cache_group_size"])
    cap = int(o.get("max_num_batched_tokens", 0)) or 2**31 - 1
    scheduler = {
        "enable_prefix_caching": False,
        "max_num_batched_tokens": cap,
        # a server trial held its sequences at once; an offline one was given GenAI's own cap
        "max_num_seqs": trial.served_sequences or min(256, cap),
        "dynamic_split_fuse": bool(o.get("dynamic_split_fuse", True)),
    }
    settings: dict[str, Any] = {"properties": properties, "scheduler": scheduler}
    if pipelines > 1:  # each behind the one arrival stream, its requests dealt in turn
        settings["pipelines_per_instance"] = pipelines
    return settings


def export_openvino_genai(study: optuna.study.Study, folder: Path, winner_total: int | None) -> list[Path]:
    """The IR folder (with its tokenizer when the model had one) as openvino-genai/, its settings as
    openvino-genai.json, a runner, and openvino-genai.sh, which runs it pinned with the trial's environment."""
    trial = best_engine_trial(study, "openvino-genai", winner_total)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "openvino-genai"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for source in trial.artifact_dir.iterdir():
        if (
            source.is_file()
            and source.name != META_FILE
            and not source.name.startswith(".")
            and source.suffix != ".lock"
        ):
            _copy(source, target / source.name)
    settings = write_text_atomic(folder / "openvino-genai.json", json.dumps(genai_settings(trial), indent=2) + "\n")
    runner = write_text_atomic(folder / "openvino-genai.py", GENAI_RUNNER)
    has_tokenizer = (target / "openvino_tokenizer.xml").is_file()
    lines = _header(trial, study.study_name, "as OpenVINO GenAI's LLMPipeline")
    lines += [
        '# Usage: ./openvino-genai.sh "PROMPT" [NEW_TOKENS]  (instance 0\'s CPUs; your server starts one per instance)',
        *(
            []
            if has_tokenizer
            else ["# the model had no tokenizer: GenAI's pipeline needs openvino_tokenizer.xml in openvino-genai/"]
        ),
        'here="$(cd "$(dirname "$0")" && pwd)"',
        " ".join(
            [
                "exec",
                *map(shlex.quote, trial.pin_prefixes[0]),
                f'"${{PYTHON:-{sys.executable}}}"',
                '"$here/openvino-genai.py"',
                '"$@"',
            ]
        ),
        "",
    ]
    script = write_text_atomic(folder / "openvino-genai.sh", "\n".join(lines), mode=0o755)
    return [target, settings, runner, script]

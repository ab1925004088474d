"""OpenVINO GenAI's ContinuousBatchingPipeline as a server under load: requests are added while others run,
and each `step` schedules one batch (new prompts, or chunks of them with dynamic split-fuse, beside the
running decodes) by its SchedulerConfig. The pipeline runs in the caller's thread (its step holds the GIL),
so the load generator's loop drives it (measure/llm_server_loop.drive).

Greedy decoding of exactly the tokens asked (ignore_eos, as every autotune backend decodes), on the same IR
and CPU plugin properties as the offline trials (generate.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.common.json_record import Record

ABORT_STEPS = 1000  # steps a cancelled request may take to leave the pipeline


@dataclass(frozen=True)
class SchedulerSettings(Record):
    """GenAI's SchedulerConfig fields the server scenario sets. 0 for max_num_batched_tokens: no cap (every
    waiting prompt in one step); 0 for cache_size: GenAI grows the KV cache as needed."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 256
    dynamic_split_fuse: bool = True
    enable_prefix_caching: bool = False
    cache_size_gb: int = 0

    def scheduler_config(self) -> Any:
        import openvino_genai

        config = openvino_genai.SchedulerConfig()
        config.max_num_batched_tokens = self.max_num_batched_tokens or sys.maxsize
        config.max_num_seqs = self.max_num_seqs
        config.dynamic_split_fuse = self.dynamic_split_fuse
        config.enable_prefix_caching = self.enable_prefix_caching
        config.cache_size = self.cache_size_gb
        return config


def default_scheduler() -> SchedulerSettings:
    """GenAI's own defaults, read from its SchedulerConfig: the row of the engine at its defaults."""
    import openvino_genai

    config = openvino_genai.SchedulerConfig()
    return SchedulerSettings(
        max_num_seqs=int(config.max_num_seqs),
        max_num_batched_tokens=int(config.max_num_batched_tokens),
        dynamic_split_fuse=bool(config.dynamic_split_fuse),
        enable_prefix_caching=bool(config.enable_prefix_caching),
        cache_size_gb=int(config.cache_size),
    )


class GenAiServer:
    """The ContinuousBatchingPipeline on an IR folder, as llm_server_loop's SteppedEngine."""

    def __init__(self, ir_dir: Path, properties: dict[str, Any], scheduler: SchedulerSettings) -> None:
        import openvino_genai

        self.scheduler = scheduler
        self.pipeline = openvino_genai.ContinuousBatchingPipeline(
            str(ir_dir), scheduler.scheduler_config(), "CPU", properties
        )
        self.engine = f"openvino-genai {openvino_genai.__version__} ContinuousBatchingPipeline"
        self._handles: dict[int, Any] = {}

    def add(self, request_id: int, prompt: Any, max_new_tokens: int) -> None:
        import numpy as np
        import openvino as ov
        import openvino_genai

        config = openvino_genai.GenerationConfig()
        config.max_new_tokens = config.min_new_tokens = max_new_tokens
        config.ignore_eos = True
        config.apply_chat_template = False
        ids = np.ascontiguousarray(np.asarray(prompt, np.int64).reshape(1, -1))
        self._handles[request_id] = self.pipeline.add_request(request_id, ov.Tensor(ids), config)

    def step(self) -> dict[int, list[int]]:
        import openvino_genai

        self.pipeline.step()
        produced: dict[int, list[int]] = {}
        for request_id, handle in list(self._handles.items()):
            while handle.can_read():
                for output in handle.read().values():
                    produced.setdefault(request_id, []).extend(int(t) for t in output.generated_ids)
            if handle.get_status() != openvino_genai.GenerationStatus.RUNNING and not handle.can_read():
                status = handle.get_status()
                del self._handles[request_id]
                if status != openvino_genai.GenerationStatus.FINISHED:
                    raise RuntimeError(f"openvino-genai request {request_id} ended {status.name}")
        return produced

    def has_work(self) -> bool:
        return bool(self._handles) or bool(self.pipeline.has_non_finished_requests())

    def abort(self) -> None:
        """Cancel every request and step until the pipeline has freed them."""
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()
        for _ in range(ABORT_STEPS):
            if not self.pipeline.has_non_finished_requests():
                return
            self.pipeline.step()
        raise RuntimeError(f"openvino-genai still held requests {ABORT_STEPS} steps after they were cancelled")

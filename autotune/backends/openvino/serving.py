"""OpenVINO GenAI's ContinuousBatchingPipeline as a server under load: requests are added while others run,
and each `step` schedules one batch (new prompts, or chunks of them with dynamic split-fuse, beside the
running decodes) by its SchedulerConfig. The pipeline runs in the caller's thread (its step holds the GIL),
so the load generator's loop drives it (measure/llm_server_loop.drive).

Several pipelines behind one arrival stream (GenAiServerPool): each in its own process pinned to its share of
the trial's cores, the requests dealt to them in turn as they arrive. A small model's step on two cores
spends much of its time keeping the threads in step: two pipelines of one thread each completed 1.2-1.3x the
requests of one of two threads in saturated bursts (96 requests each, the trained 23M Llama's int8 IR, bf16,
a 2-core Xeon with AMX). Each of their steps is slower, though, so under a TPOT bound the gain may be gone:
whether it wins is the search's to measure (docs/manual/benchmarks-log.md, 2026-12-01).

Greedy decoding of exactly the tokens asked (ignore_eos, as every autotune backend decodes), on the same IR
and CPU plugin properties as the offline trials (generate.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from collections.abc import Iterator
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

    def held(self) -> set[int]:
        """The requests it still holds (not finished, not yet read to their end)."""
        return set(self._handles)

    def step(self, wait_s: float | None = None) -> dict[int, list[int]]:
        """One step of the pipeline, run now (`wait_s` is a pool's: this engine never waits for tokens)."""
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


def cpu_groups(cpus: list[int], count: int) -> list[list[int]]:
    """`cpus` dealt into `count` runs of neighbours, as even as they divide (the first ones one larger)."""
    if not 1 <= count <= len(cpus):
        raise ValueError(f"{count} server instances need at least {count} CPUs, the trial has {len(cpus)}")
    size, extra = divmod(len(cpus), count)
    groups, start = [], 0
    for index in range(count):
        end = start + size + (index < extra)
        groups.append(cpus[start:end])
        start = end
    return groups


def _serve_in_child(
    connection: Any, ir_dir: str, properties: dict[str, Any], scheduler: SchedulerSettings, cpus: list[int]
) -> None:
    """One pool member: a GenAiServer pinned to `cpus`, stepped while it holds requests; the parent's
    messages (add, abort, stop) are read between steps, and each step's tokens sent back with the requests
    it finished."""
    os.sched_setaffinity(0, cpus)
    try:
        server = GenAiServer(Path(ir_dir), properties, scheduler)
        connection.send(("ready", server.engine))
        while True:
            while not server.has_work() or connection.poll(0):
                message = connection.recv()
                if message[0] == "add":
                    server.add(*message[1:])
                elif message[0] == "abort":
                    server.abort()
                    connection.send(("aborted",))
                else:
                    return
            before = server.held()
            produced = server.step()
            connection.send(("tokens", produced, sorted(before - server.held())))
    except (EOFError, KeyboardInterrupt):
        return
    except Exception as failure:  # carried to the parent, which raises it
        connection.send(("failed", f"{type(failure).__name__}: {failure}"))


class GenAiServerPool:
    """Several GenAiServers, one process each pinned to its CPUs, behind one arrival stream: llm_server_loop's
    SteppedEngine. A request goes to the members in turn as it arrives (round robin); `step` waits for the
    tokens any member sent, at most until the next arrival is due."""

    def __init__(
        self, ir_dir: Path, properties: dict[str, Any], scheduler: SchedulerSettings, groups: list[list[int]]
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._connections: list[Any] = []
        self._processes: list[Any] = []
        self._owner: dict[int, int] = {}  # request -> the member holding it
        self._turn = 0
        try:
            for cpus in groups:
                parent, child = context.Pipe()
                member = {**properties, "INFERENCE_NUM_THREADS": len(cpus)}
                process = context.Process(
                    target=_serve_in_child, args=(child, str(ir_dir), member, scheduler, cpus), daemon=True
                )
                process.start()
                child.close()
                self._connections.append(parent)
                self._processes.append(process)
            engines = {self._expect(index, "ready")[1] for index in range(len(groups))}
        except BaseException:
            self.close()
            raise
        self.engine = f"{' '.join(sorted(engines))} x {len(groups)} processes ({' | '.join(map(str, groups))})"

    def _expect(self, index: int, kind: str) -> tuple[Any, ...]:
        """Member `index`'s next message of `kind`, its tokens before it dropped (an abort's)."""
        while True:
            message = self._receive(index)
            if message[0] == kind:
                return message

    def _died(self, index: int) -> RuntimeError:
        self._processes[index].join(1)
        return RuntimeError(f"openvino-genai server instance {index} died (exit {self._processes[index].exitcode})")

    def _receive(self, index: int) -> tuple[Any, ...]:
        try:
            message = self._connections[index].recv()
        except EOFError:
            raise self._died(index) from None
        if message[0] == "failed":
            raise RuntimeError(f"openvino-genai server instance {index} failed: {message[1]}")
        return message

    def add(self, request_id: int, prompt: Any, max_new_tokens: int) -> None:
        import numpy as np

        index = self._turn % len(self._connections)
        self._turn += 1
        self._owner[request_id] = index
        try:
            self._connections[index].send(("add", request_id, np.asarray(prompt, np.int64), max_new_tokens))
        except OSError:  # its end of the pipe is gone with it
            raise self._died(index) from None

    def step(self, wait_s: float | None = None) -> dict[int, list[int]]:
        """The tokens the members sent by now, waiting for the first up to `wait_s` (None: until one comes)."""
        from multiprocessing.connection import wait

        produced: dict[int, list[int]] = {}
        ready = wait(self._connections, None if wait_s is None else max(wait_s, 0.0))
        for connection in ready:
            index = self._connections.index(connection)
            while self._connections[index].poll(0):
                _, tokens, finished = self._expect(index, "tokens")
                for request, ids in tokens.items():
                    produced.setdefault(request, []).extend(ids)
                for request in finished:
                    self._owner.pop(request, None)
        return produced

    def has_work(self) -> bool:
        return bool(self._owner)

    def abort(self) -> None:
        """Every member drops its requests; their tokens sent before are read and dropped."""
        for index, connection in enumerate(self._connections):
            try:
                connection.send(("abort",))
            except OSError:
                raise self._died(index) from None
        for index in range(len(self._connections)):
            self._expect(index, "aborted")
        self._owner.clear()

    def close(self) -> None:
        for connection in self._connections:
            try:
                connection.send(("stop",))
            except OSError:
                pass
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()


@contextlib.contextmanager
def open_genai_server(
    ir_dir: Path, properties: dict[str, Any], scheduler: SchedulerSettings, pipelines: int, threads: int
) -> Iterator[GenAiServer | GenAiServerPool]:
    """One pipeline in this process, or `pipelines` of them pinned apart over the first `threads` CPUs this
    process may run on (each member's INFERENCE_NUM_THREADS its share); the pool's processes end with it."""
    if pipelines == 1:
        yield GenAiServer(ir_dir, properties, scheduler)
        return
    groups = cpu_groups(sorted(os.sched_getaffinity(0))[:threads], pipelines)
    pool = GenAiServerPool(ir_dir, properties, scheduler, groups)
    try:
        yield pool
    finally:
        pool.close()

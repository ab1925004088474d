"""Greedy decoding with a KV cache, autotune's own rather than `model.generate`: it decodes exactly
`new_tokens` tokens (no stop at an end-of-sequence token), and stamps the time each token is known,
which is what time to first token (TTFT) and time per output token (TPOT) are read from. Imports torch
and transformers inside functions only."""

from __future__ import annotations

import contextlib
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Prompt positions whose logits the drift pass compares (the last ones; all of a shorter prompt).
DRIFT_POSITIONS = 128


@dataclass
class Generator:
    """Greedy decoding of exactly `new_tokens` tokens for a batch of prompts, stamping each token."""

    model: Any
    new_tokens: int
    kv_cache: str = "dynamic"
    token_stamps: array = field(default_factory=lambda: array("d"))
    forward: Any = None  # the (maybe compiled) forward; None: the model's own
    _static: dict[tuple[int, int], Any] = field(default_factory=dict)
    # The forward computes the output layer at the positions asked for only (transformers'
    # `logits_to_keep`): a timed prefill needs the last one, not prompt x vocabulary logits.
    _keeps_logits: bool = False
    # A compiled forward (inductor): the timed prefill keeps the drift pass's positions, so both run one
    # graph (another width is another graph, and a recompile makes the width symbolic in the timed one).
    compiled: bool = False

    def __post_init__(self) -> None:
        import inspect

        if self.forward is None:
            self.forward = self.model.forward
        try:
            self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        except (TypeError, ValueError):
            self._keeps_logits = False

    def _kept(self, positions: int) -> dict[str, int]:
        """The forward's argument that limits its logits to the last `positions` (none when it has none)."""
        return {"logits_to_keep": positions} if self._keeps_logits else {}

    def _cache(self, batch: int, length: int) -> Any:
        """A fresh dynamic cache per generation; one static cache per shape, reset between generations:
        a graph compiled with freezing keeps the first static cache's buffers, and a new cache object
        after it reads out of bounds."""
        if self.kv_cache == "static":
            from transformers import StaticCache

            cached = self._static.get((batch, length))
            if cached is None:
                cached = self._static[(batch, length)] = StaticCache(config=self.model.config, max_cache_len=length)
            else:
                cached.reset()
            return cached
        from transformers import DynamicCache

        return DynamicCache()

    @contextlib.contextmanager
    def open_server(self, slots: int, context_tokens: int, folder: Path) -> Iterator[tuple[Any, bool]]:
        """The server scenario on PyTorch: static batches of up to `slots` requests on this generator
        (static_server), the baseline the engines' continuous batching is measured against; stepped in the
        caller's thread (`context_tokens` and `folder` are llama-server's concern)."""
        from autotune.backends.generation.static_server import StaticBatchServer

        if self.compiled:
            raise RuntimeError(
                "a compiled forward (inductor) runs the shapes it was compiled for, and a static batch's prompt "
                "lengths vary with its requests: serve PyTorch eager"
            )
        yield StaticBatchServer(self, slots), False

    def generate(self, input_ids: Any, stamp: bool = True) -> Any:
        """The new tokens (batch x new_tokens); with `stamp`, the time each token is known is appended
        to `token_stamps` (the first one ends the prefill)."""
        return self._decode(input_ids, stamp, keep_logits=0)[0]

    def generate_with_logits(self, input_ids: Any, positions: int, forced: Any = None) -> tuple[Any, Any]:
        """The new tokens and the next-token logits (float32) at the prompt's last `positions` and at every
        decode step: one generation through the same graphs a timed call runs, so drift is measured on
        what is timed (a teacher-forced pass of another shape compiles, and times nothing, other code).
        With `forced` (batch x new_tokens), each decode step is fed the forced token of the step before
        instead of its own, so every step's logits follow the same text as the reference's."""
        return self._decode(input_ids, stamp=False, keep_logits=positions, forced=forced)

    def _decode(self, input_ids: Any, stamp: bool, keep_logits: int, forced: Any = None) -> tuple[Any, Any]:
        import torch

        batch, prompt = input_ids.shape
        cache = self._cache(batch, prompt + self.new_tokens)
        out = torch.empty(batch, self.new_tokens, dtype=torch.long)
        kept = None  # one buffer, filled in place: a copy per step and a concatenation would double it
        with torch.no_grad():
            positions = torch.arange(prompt)
            logits = self.forward(
                input_ids=input_ids,
                past_key_values=cache,
                use_cache=True,
                cache_position=positions,
                **self._kept(min(DRIFT_POSITIONS, prompt) if self.compiled else max(keep_logits, 1)),
            ).logits
            if keep_logits:
                kept = torch.empty(batch, keep_logits + self.new_tokens - 1, logits.shape[-1], dtype=torch.float32)
                kept[:, :keep_logits] = logits[:, -keep_logits:, :]
            token = logits[:, -1, :].argmax(dim=-1)
            out[:, 0] = token
            if stamp:
                self.token_stamps.append(time.monotonic())
            decode_kept = self._kept(1)
            for step in range(1, self.new_tokens):
                # A forced token is copied out fresh: the shape, strides and offset of an argmax's token,
                # so a compiled forward runs the graph it times.
                fed = token if forced is None else forced[:, step - 1].clone(memory_format=torch.contiguous_format)
                position = torch.tensor([prompt + step - 1])
                logits = self.forward(
                    input_ids=fed[:, None],
                    past_key_values=cache,
                    use_cache=True,
                    cache_position=position,
                    **decode_kept,
                ).logits
                if kept is not None:
                    kept[:, keep_logits + step - 1] = logits[:, -1, :]
                token = logits[:, -1, :].argmax(dim=-1)
                out[:, step] = token
                if stamp:
                    self.token_stamps.append(time.monotonic())
        return out, kept

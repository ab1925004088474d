"""PyTorch's fixed-batch path as a server under load: static batching, the baseline continuous batching is
measured against. Requests queue; when no batch runs, up to `slots` of them start together (their prompts
left-padded to the longest, masked), and the batch decodes until its longest output is done while new
arrivals wait for the next batch, as `model.generate` on a batch serves them. A request's tokens stop at its
own length (its row keeps decoding as padding until the batch ends).

It is a stepped engine (measure/llm_server_loop's `drive`): one step is the batch's prefill or one decode
token for every row, on the trial's own generator (decode_loop.Generator: its prepared model and forward).
Imports torch inside functions only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class _Batch:
    """The batch in flight: each row's request id, tokens still owed, last token, and the attention mask so far."""

    ids: list[int]
    owed: list[int]
    tokens: Any  # (rows,) the last token of each row
    mask: Any  # (rows, positions) 1 for a real position, 0 for left padding
    cache: Any


class StaticBatchServer:
    """Static batches of up to `slots` requests on a decode_loop.Generator (module docstring)."""

    def __init__(self, generator: Any, slots: int, pad_id: int = 0) -> None:
        if slots < 1:
            raise ValueError(f"a static batch holds at least one request, got {slots}")
        self.generator = generator
        self.slots = slots
        self.pad_id = pad_id
        self.engine = f"PyTorch static batches of {slots}"
        self._waiting: deque[tuple[int, np.ndarray, int]] = deque()
        self._batch: _Batch | None = None

    def add(self, request_id: int, prompt: np.ndarray, max_new_tokens: int) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"a request asks for at least one token, got {max_new_tokens}")
        self._waiting.append((request_id, np.asarray(prompt, dtype=np.int64), int(max_new_tokens)))

    def has_work(self) -> bool:
        return bool(self._waiting) or self._batch is not None

    def abort(self) -> None:
        self._waiting.clear()
        self._batch = None

    def step(self, wait_s: float | None = None) -> dict[int, list[int]]:
        """The next batch's prefill when none runs, else one decode token for every row of the one that does."""
        import torch

        with torch.no_grad():
            return self._decode() if self._batch is not None else self._prefill()

    def _forward(self, input_ids: Any, mask: Any, cache: Any) -> Any:
        import torch

        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]
        logits = self.generator.forward(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **self.generator._kept(1),
        ).logits
        return torch.argmax(logits[:, -1, :], dim=-1)

    def _prefill(self) -> dict[int, list[int]]:
        import torch
        from transformers import DynamicCache

        taken = [self._waiting.popleft() for _ in range(min(self.slots, len(self._waiting)))]
        if not taken:
            return {}
        longest = max(len(prompt) for _, prompt, _ in taken)
        input_ids = torch.full((len(taken), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(taken), longest), dtype=torch.long)
        for row, (_, prompt, _) in enumerate(taken):
            input_ids[row, longest - len(prompt) :] = torch.from_numpy(prompt)
            mask[row, longest - len(prompt) :] = 1
        cache = DynamicCache()
        tokens = self._forward(input_ids, mask, cache)
        ids = [request for request, _, _ in taken]
        owed = [wanted - 1 for _, _, wanted in taken]
        self._batch = _Batch(ids, owed, tokens, mask, cache) if max(owed) > 0 else None
        return {request: [int(tokens[row])] for row, request in enumerate(ids)}

    def _decode(self) -> dict[int, list[int]]:
        import torch

        batch = self._batch
        assert batch is not None
        batch.mask = torch.cat([batch.mask, torch.ones((len(batch.ids), 1), dtype=torch.long)], dim=1)
        batch.tokens = self._forward(batch.tokens[:, None], batch.mask, batch.cache)
        produced: dict[int, list[int]] = {}
        for row, request in enumerate(batch.ids):
            if batch.owed[row] > 0:
                produced[request] = [int(batch.tokens[row])]
                batch.owed[row] -= 1
        if max(batch.owed) <= 0:
            self._batch = None
        return produced

"""Time to first token and time per output token from a generation's stamps.

A call's stamps are its start and end; its token stamps are the moments each new token was known. TTFT
is the first token's stamp minus the call's start (the prefill), TPOT the gaps between consecutive
tokens (one decode step each). Only calls wholly inside the common window count, as for latency.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autotune.measure.stopwatch import wholly_inside


@dataclass(frozen=True)
class TokenTimes:
    """Seconds: one TTFT per call, one TPOT per decode step, one generation time per call."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    generation_s: np.ndarray


def token_times(calls: list[np.ndarray], tokens: list[np.ndarray], start: float, end: float) -> TokenTimes:
    """Per instance `calls` (n x 2 [start, end]) and `tokens` (n x new_tokens): the calls wholly inside
    [start, end], split into prefill and decode steps."""
    ttft, tpot, whole = [], [], []
    for call, token in zip(calls, tokens):
        if len(call) != len(token):
            raise ValueError(f"{len(call)} calls but token stamps for {len(token)}")
        inside = wholly_inside(call, start, end)
        ttft.append(token[inside, 0] - call[inside, 0])
        tpot.append(np.diff(token[inside], axis=1).reshape(-1))
        whole.append(token[inside, -1] - call[inside, 0])
    return TokenTimes(np.concatenate(ttft), np.concatenate(tpot), np.concatenate(whole))

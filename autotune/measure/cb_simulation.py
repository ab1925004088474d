"""An exact model of a continuous-batching server whose step costs are known: what the load generator's
measurements of a server are checked against, as queueing theory checks the classification server scenario.

The server holds `max_seqs` slots. Each step begins by admitting the requests that have arrived, in arrival
order, into the free slots; it then prefills the newly admitted requests' whole prompts and decodes one token
for every request admitted before; it costs `fixed_s` + `per_prompt_token_s` x the prompt tokens prefilled +
`per_decode_seq_s` x the requests decoded. When it ends, each new request has its first token and each other
one its next; a request with all its output tokens leaves its slot. With no request in a slot the server
waits for the next arrival. (llama-server's slots with its default continuous batching behave so when a
step's cost is linear in its tokens; a prompt split across steps is another scheduler.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autotune.measure.llm_load import RequestTiming


@dataclass(frozen=True)
class StepCosts:
    """Seconds one server step takes: a fixed part, per prompt token prefilled and per request decoded."""

    fixed_s: float
    per_prompt_token_s: float
    per_decode_seq_s: float

    def of(self, prompt_tokens: int, decoded: int) -> float:
        return self.fixed_s + self.per_prompt_token_s * prompt_tokens + self.per_decode_seq_s * decoded


def simulate(
    arrivals: np.ndarray, prompt_lengths: np.ndarray, output_lengths: np.ndarray, costs: StepCosts, max_seqs: int
) -> list[RequestTiming]:
    """Every request's token times under the module's scheduler, for arrivals sorted in time."""
    count = len(arrivals)
    times: list[list[float]] = [[] for _ in range(count)]
    running: list[int] = []
    admitted = 0
    now = 0.0
    while admitted < count or running:
        if not running and admitted < count:
            now = max(now, float(arrivals[admitted]))
        new: list[int] = []
        while len(running) + len(new) < max_seqs and admitted < count and arrivals[admitted] <= now:
            new.append(admitted)
            admitted += 1
        decoded = len(running)
        now += costs.of(int(sum(int(prompt_lengths[i]) for i in new)), decoded)
        running.extend(new)
        for index in running:
            times[index].append(now)
        running = [i for i in running if len(times[i]) < int(output_lengths[i])]
    return [RequestTiming(float(arrivals[i]), int(output_lengths[i]), tuple(times[i])) for i in range(count)]

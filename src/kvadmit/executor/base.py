"""The executor protocol: run one scheduled batch, return one sampled token per request and how long
the step took. The torch executor measures its time; the simulated one predicts it."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from kvadmit.scheduler.types import ScheduledBatch


class StepResult(NamedTuple):
    next_token_ids: list[int]  # one per request, in batch order
    seconds: float  # the step's duration (predicted or measured)
    # (a token id, the positions whose token is not it), where the executor knows (the simulated one's
    # decode steps): the scheduler then looks for stop tokens at those positions only
    filler: tuple[int, list[int]] | None = None
    graph: bool = False  # it ran from a captured graph (CUDA graph, or the compiled decode on a CPU)


class Executor(Protocol):
    def run(self, batch: ScheduledBatch) -> StepResult: ...

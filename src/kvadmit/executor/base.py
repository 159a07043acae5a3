"""The executor protocol: run one scheduled batch, return one sampled token per request and how long
the step took. The torch executor measures its time; the simulated one predicts it."""

from __future__ import annotations

from typing import Protocol

from kvadmit.scheduler.types import ScheduledBatch


class StepResult:
    """A plain class, not a NamedTuple: the compiled core builds one per step, and a NamedTuple's
    constructor is interpreted Python even there (a native class's is a C call)."""

    def __init__(
        self,
        next_token_ids: list[int],
        seconds: float,
        filler: tuple[int, list[int]] | None = None,
        graph: bool = False,
    ) -> None:
        self.next_token_ids = next_token_ids  # one per request, in batch order
        self.seconds = seconds  # the step's duration (predicted or measured)
        # (a token id, the positions whose token is not it), where the executor knows (the simulated
        # one's decode steps): the scheduler then looks for stop tokens at those positions only
        self.filler = filler
        self.graph = graph  # it ran from a captured graph (CUDA graph, or the compiled decode on a CPU)


class Executor(Protocol):
    def run(self, batch: ScheduledBatch) -> StepResult: ...

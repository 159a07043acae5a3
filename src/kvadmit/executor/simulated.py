"""The simulated executor: no model, a predicted step time, and outputs that end where the workload says.

Each request has a true output length. Under ignore_eos that is max_new_tokens; otherwise the request's
token number `true_len` is EOS, so the scheduler sees it stop early exactly as a real model would.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvadmit.executor.base import StepResult
from kvadmit.executor.costmodel import CostModel
from kvadmit.scheduler.scheduler import ScheduledBatch

EOS_TOKEN_ID = 2
TEXT_TOKEN_ID = 1000  # what every non-final simulated token is


class SimulatedExecutor:
    def __init__(self, cost: CostModel, true_output_len: Mapping[str, int], eos_token_id: int = EOS_TOKEN_ID):
        self.cost = cost
        self.true_output_len = true_output_len  # rid → tokens it generates before EOS (EOS included)
        self.eos = eos_token_id

    def run(self, batch: ScheduledBatch) -> StepResult:
        # A request's next token is number len(outputs) + 1: EOS once that reaches its true length.
        stop_at, never, eos = self.true_output_len.get, 1 << 62, self.eos
        tokens = [
            eos if stop_at(r.rid, never) <= len(r.output_ids) + 1 else TEXT_TOKEN_ID for r in batch.reqs
        ]
        if batch.kind == "prefill":
            new = sum(r.extend_input_len for r in batch.reqs)
            cached = sum(r.prefix_len for r in batch.reqs)
            seconds = self.cost.prefill.seconds(len(batch.reqs), new, cached)
        else:
            kv = sum(len(r.kv) for r in batch.reqs) if self.cost.decode.per_kv_token_ms else 0
            seconds = self.cost.decode.seconds(len(batch.reqs), kv)
        return StepResult(tokens, seconds)

"""The simulated executor: no model, a predicted step time, and outputs that end where the workload says.

Each request has a true output length. Under ignore_eos that is max_new_tokens; otherwise the request's
token number `true_len` is EOS, so the scheduler sees it stop early exactly as a real model would.

A running request gets one token in every decode step from the one after its prefill until it ends or is
retracted, so the decode step in which its EOS falls is known at its prefill: the executor files it
there instead of checking every request every step.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

from kvadmit.costmodel.costmodel import CostModel
from kvadmit.executor.base import StepResult
from kvadmit.request import Req
from kvadmit.scheduler.types import ScheduledBatch

_KV = operator.attrgetter("kv")
EOS_TOKEN_ID = 2
TEXT_TOKEN_ID = 1000  # what every non-final simulated token is


class SimulatedExecutor:
    def __init__(self, cost: CostModel, true_output_len: Mapping[str, int], eos_token_id: int = EOS_TOKEN_ID):
        self.cost = cost
        self.true_output_len = true_output_len  # rid → tokens it generates before EOS (EOS included)
        self.eos = eos_token_id
        self._decode_steps = 0
        self._due: dict[int, list[tuple[Req, int]]] = {}  # decode step → (request, its retraction count)
        # A decode step's time by batch size, where the cost model does not read the KV (the model is
        # frozen and its seconds() a function of its arguments: the same float as computing it each step)
        self._kv_matters = cost.decode.needs_kv_tokens
        self._decode_s: dict[int, float] = {}

    def run(self, batch: ScheduledBatch) -> StepResult:
        if batch.kind == "prefill":
            return self._run_prefill(batch)
        tokens, eos_at = self._decode_tokens(batch.reqs)
        kv = 0
        if self._kv_matters:
            # The KV the batch holds: the scheduler's running sum (summing here was a sixth of a long run)
            kv = batch.kv_tokens if batch.kv_tokens >= 0 else sum(map(len, map(_KV, batch.reqs)))
        return StepResult(tokens, self._decode_seconds(len(batch.reqs), kv), (TEXT_TOKEN_ID, eos_at))

    def eos_due(self) -> bool:
        """Does the next decode step end a request (an EOS filed for it that still counts)?"""
        return any(
            req.retraction_count == retractions and req.finished_reason is None
            for req, retractions in self._due.get(self._decode_steps, ())
        )

    def quiet_decode(self, batch_size: int, kv_tokens: int) -> float:
        """A decode step of `batch_size` requests holding `kv_tokens` that ends none (eos_due() is False;
        sim/leap.py): what run() does with it, without the batch: its step counted, its time."""
        self._due.pop(self._decode_steps, None)  # entries left by requests that ended or were retracted
        self._decode_steps += 1
        return self._decode_seconds(batch_size, kv_tokens)

    def _decode_seconds(self, batch_size: int, kv_tokens: int) -> float:
        if self._kv_matters:
            return self.cost.decode.seconds(batch_size, kv_tokens)
        seconds = self._decode_s.get(batch_size)
        if seconds is None:
            seconds = self._decode_s[batch_size] = self.cost.decode.seconds(batch_size, 0)
        return seconds

    def _decode_tokens(self, reqs: list[Req]) -> tuple[list[int], list[int]]:
        """One decode step's tokens (a decode batch, or a mixed chunk's decode rows): EOS where it is due;
        and the positions of the EOS tokens (every other token is TEXT_TOKEN_ID)."""
        step = self._decode_steps
        self._decode_steps += 1
        tokens = [TEXT_TOKEN_ID] * len(reqs)
        eos_at: list[int] = []
        for req, retractions in self._due.pop(step, ()):
            if req.retraction_count == retractions and req.finished_reason is None:
                i = reqs.index(req)
                tokens[i] = self.eos
                eos_at.append(i)
        return tokens, eos_at

    def _run_prefill(self, batch: ScheduledBatch) -> StepResult:
        rows = batch.reqs
        decode_tokens: list[int] = []
        if batch.decoding:
            # Mixed chunk: the running requests' decode step rides in this batch (it counts as their decode
            # step, before the new requests' next tokens are filed). Its cost: one more new token each,
            # attending to its KV, in the prefill's time.
            rows = batch.reqs[: len(batch.reqs) - len(batch.decoding)]
            decode_tokens = self._decode_tokens(batch.decoding)[0]
        tokens = self._prefill_tokens(batch, rows) + decode_tokens
        new = sum(r.extend_input_len for r in rows) + len(decode_tokens)
        cached = sum(r.prefix_len for r in rows) + sum(len(r.kv) - 1 for r in batch.decoding or ())
        return StepResult(tokens, self.cost.prefill.seconds(len(batch.reqs), new, cached))

    def _prefill_tokens(self, batch: ScheduledBatch, rows: list[Req]) -> list[int]:
        tokens = []
        for req in rows:
            true_len = self.true_output_len.get(req.rid)
            number = len(req.output_ids) + 1  # the token this prefill produces
            if true_len is not None and number >= true_len:
                tokens.append(self.eos)
                continue
            tokens.append(TEXT_TOKEN_ID)
            if true_len is not None and req is not batch.chunked:
                # Token number + k comes from the k-th decode step from now (index _decode_steps + k − 1).
                self._due.setdefault(self._decode_steps + true_len - number - 1, []).append(
                    (req, req.retraction_count)
                )
        return tokens

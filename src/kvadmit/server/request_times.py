"""The time stats SGLang 0.5.22 adds to /generate's `meta_info` under --enable-metrics.

The scheduler's, in every chunk (its `SchedulerReqTimeStats.convert_to_output_meta_info`):
`storage_prefetch_wait` and `storage_staging_wait` (seconds spent waiting on the hierarchical cache's
storage tiers: always 0 here, with one tier), `forward_entry_time` (wall clock when the request first went
into a forward batch), `prefill_finished_time` (wall clock when its prompt's last chunk was computed) — each
once it has happened — and `queue_time` (seconds in the waiting queue before entering a forward batch,
summed over the times a retraction sent it back).

The tokenizer manager's, at the end (`APIServerReqTimeStats.convert_to_output_meta_info`), after
`e2e_latency`: `request_received_ts`, `first_token_latency` (first output − receipt), `api_server_dispatch_
finish_ts` (when the request was handed to the scheduler), `response_sent_to_client_ts` (when its first
answer went out, once it has), `request_finished_ts`, and `decode_throughput` (tokens after the first per
second of decoding, with two tokens or more). Timestamps are Unix seconds.

The engine thread keeps the scheduler's side (RequestTimes); the handler adds its own (api_side).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvadmit.executor.base import StepResult
from kvadmit.scheduler.events import Retraction
from kvadmit.scheduler.types import ScheduledBatch


@dataclass(slots=True)
class _Times:
    waiting_since: float  # when it (re-)entered the waiting queue
    forward_entry: float = 0.0  # first forward batch
    prefill_finished: float = 0.0
    queued: float = 0.0  # seconds waiting, summed over retractions
    in_forward: bool = False  # in a forward batch since it last waited


class RequestTimes:
    """The scheduler-side time stats of live requests (engine thread only)."""

    def __init__(self) -> None:
        self._times: dict[str, _Times] = {}

    def arrived(self, rid: str, now: float) -> None:
        self._times[rid] = _Times(waiting_since=now)

    def on_step(self, batch: ScheduledBatch, result: StepResult, now: float) -> None:
        """A step observer: a prefill batch started `result.seconds` before now (when it was scheduled)
        and finished the prompts of all its requests but a chunked one."""
        if batch.kind != "prefill":
            return
        started = now - result.seconds
        for req in batch.reqs:
            t = self._times.get(req.rid)
            if t is None:
                continue
            if not t.in_forward:
                t.in_forward = True
                t.queued += max(0.0, started - t.waiting_since)
                if t.forward_entry == 0.0:
                    t.forward_entry = started
            if req is not batch.chunked and t.prefill_finished == 0.0:
                t.prefill_finished = now

    def on_event(self, event: object, now: float) -> None:
        """An observer: a retracted request waits again (its later wait adds to queue_time)."""
        if isinstance(event, Retraction):
            for rid in event.rids:
                t = self._times.get(rid)
                if t is not None:
                    t.in_forward, t.waiting_since = False, now

    def meta(self, rid: str) -> dict[str, Any] | None:
        t = self._times.get(rid)
        if t is None:
            return None
        out: dict[str, Any] = {"storage_prefetch_wait": 0.0, "storage_staging_wait": 0.0}
        if t.forward_entry > 0.0:
            out["forward_entry_time"] = t.forward_entry
        if t.prefill_finished > 0.0:
            out["prefill_finished_time"] = t.prefill_finished
        out["queue_time"] = t.queued
        return out

    def forget(self, rid: str) -> None:
        self._times.pop(rid, None)


def api_side(
    received: float,
    dispatched: float,
    first_output: float | None,
    first_sent: float | None,
    finished: float,
    completion_tokens: int,
) -> dict[str, Any]:
    """The tokenizer manager's fields at a request's end (wall-clock seconds in, SGLang's names out)."""
    out: dict[str, Any] = {"request_received_ts": received}
    if first_output is not None and first_output > received:
        out["first_token_latency"] = first_output - received
    out["api_server_dispatch_finish_ts"] = dispatched
    if first_sent is not None:
        out["response_sent_to_client_ts"] = first_sent
    out["request_finished_ts"] = finished
    if first_output is not None and completion_tokens > 1 and finished > first_output:
        # SGLang: 1 / time per output token, where TPOT = decode latency / (completion_tokens − 1)
        out["decode_throughput"] = (completion_tokens - 1) / (finished - first_output)
    return out

"""`--trace-steps FILE`, for `kvadmit simulate` and `kvadmit serve` alike: one JSON line per step, with
the same fields from both, so a server's steps and a replay of its requests compare one to one.

    step            the step's number (1, 2, …): every step since the start, those of earlier requests
                    too (a benchmark's settling or warm-up runs)
    t               seconds since the start when the step ended
    kind            prefill or decode
    batch_size      requests in the batch
    new_tokens      tokens the step computed (a prefill's uncached prompt tokens; a decode's one per request)
    cached_tokens   a prefill's tokens found in the prefix cache
    seconds         the step's time: simulated, the cost model's; served, measured from the scheduling
                    pass to the step's tokens handed to the HTTP side
    forward_s       (served only) the executor's own part of it
    running, queue, used_tokens, new_token_ratio: the scheduler's state after the step

While the engine is busy, t minus the previous step's t is the whole cycle: on a server, the commands
the engine ran between the two steps, then this step; in a simulation, `seconds`. Across an idle spell
it also holds the wait for the next request.
"""

from __future__ import annotations

from kvadmit.scheduler.scheduler import ScheduledBatch, Scheduler


def step_row(
    sched: Scheduler, batch: ScheduledBatch, step: int, t: float, seconds: float
) -> dict[str, object]:
    """One row: what ran, how long it took, and the scheduler's state after it."""
    prefill = batch.kind == "prefill"
    return {
        "step": step,
        "t": round(t, 6),
        "kind": batch.kind,
        "batch_size": len(batch.reqs),
        "new_tokens": sum(r.extend_input_len for r in batch.reqs) if prefill else len(batch.reqs),
        "cached_tokens": sum(r.prefix_len for r in batch.reqs) if prefill else 0,
        "seconds": round(seconds, 9),
        "running": len(sched.running.reqs),
        "queue": len(sched.waiting),
        "used_tokens": sched.num_used_tokens(),
        "new_token_ratio": sched.ratio.current,
    }

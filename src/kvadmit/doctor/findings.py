"""From what a log says to findings: each with a verdict, quoted evidence and what to do.

The rules (retraction_rules.py, pool_rules.py) read what the numbers mean, not how a log words them:
* requests *wait* when the queue is substantial beside the running batch (trackers.QueueStats);
* the pool is *idle* when token usage stays under 0.7 (98% of the waiting samples) while they wait;
* retraction is a *storm* when its rate exceeds ~1/min even at the low end of what the count allows,
  or comes in bursts of 5 in a minute (rates.py); otherwise it is *occasional*;
* throughput *collapses* when generation tokens/s per running request fall threefold after a retraction
  and stay there;
* a failure is *unrelated* to the KV pool when it happens with no retraction and usage under 0.9.
"""

from __future__ import annotations

from kvadmit.doctor import advice, explain
from kvadmit.doctor.collect import Collected
from kvadmit.doctor.model import (
    HEALTHY_QUEUE,
    IDLE_POOL,
    OTHER,
    RANK_HEALTHY_NO_QUEUE,
    RANK_HEALTHY_WAITING,
    RANK_INSUFFICIENT,
    STORM,
    Finding,
)
from kvadmit.doctor.pool_rules import idle, oom, unrelated
from kvadmit.doctor.retraction_rules import collapse, retraction, stall, vllm_preemption
from kvadmit.doctor.trackers import Quote, unique


def log_findings(c: Collected, pool_from_metrics: float | None = None) -> list[Finding]:
    pool, note = explain.pool_size(c, pool_from_metrics)
    shape = c.waves.shape()
    arithmetic = explain.wave_arithmetic(c, shape, pool) if shape is not None and pool else None
    found: list[Finding] = []
    for rule in (oom, collapse, retraction, vllm_preemption, stall, unrelated):
        f = rule(c)
        if f is not None:
            found.append(f)
    # When the admission rule itself explains how many run (a whole request more does not fit), the pool
    # is not idle however low its usage looks between waves.
    waiting_idle = idle(c) if arithmetic is None else None
    if waiting_idle is not None:
        found.append(waiting_idle)
    verdicts = {f.verdict for f in found}
    if not verdicts & {STORM, IDLE_POOL} and c.queue.with_queue_info:
        found.append(_healthy(c, pool, note, arithmetic))
    return found


# -- healthy -------------------------------------------------------------------------------------------


def _healthy(c: Collected, pool: int | None, note: str, arithmetic: list[str] | None) -> Finding:
    q = c.queue
    retraction = "" if not c.retract.events else ", apart from the retraction noted below"
    if q.waiting == 0:
        max_q = q.max_queue[0] if q.max_queue else 0
        top = q.max_usage
        usage = f", token usage up to {top[0]:.2f}" if top else ""
        title = f"Healthy: no request waits (#queue-req at most {max_q:,}{usage})"
        lines = [
            f"Every arrival is admitted at once{retraction}: the queue never builds beside the running "
            "batch, so admission is not holding anyone back."
        ]
        if max_q:
            lines.append(
                f"A queue of {max_q:,} beside the running batch is requests that arrived between two "
                "scheduling passes."
            )
        evidence = unique([q.max_usage[1] if q.max_usage else None, q.max_queue[1] if q.max_queue else None])
        return Finding(
            HEALTHY_QUEUE,
            HEALTHY_QUEUE,
            RANK_HEALTHY_NO_QUEUE,
            title,
            lines,
            evidence,
            advice.no_queue(),
            {"max_queue": max_q},
        )
    shape = c.waves.shape() if arithmetic is not None else None
    lines = list(arithmetic) if arithmetic else explain.generic_arithmetic(c, pool, note)
    trend = explain.queue_trend(c)
    if trend:
        lines.append(trend)
    high = q.high_wait[0] if q.high_wait else None
    title = "Healthy queue: requests wait because the pool is used up to the forecast"
    if high is not None:
        title += f" (token usage up to {high:.2f} while they wait)"
    title += retraction
    evidence = unique([c.startup_quote, q.first_wait, q.high_wait[1] if q.high_wait else None, q.last_wait])
    numbers: dict[str, object] = {
        "pool": pool,
        "waiting_samples": q.waiting,
        "usage_peak_waiting": q.usage_quantile(0.98),
    }
    if shape is not None:
        numbers.update(
            running_at_once=shape.running, prompt_len=shape.prompt_len, max_new_tokens=shape.max_new_tokens
        )
    return Finding(
        HEALTHY_QUEUE, HEALTHY_QUEUE, RANK_HEALTHY_WAITING, title, lines, evidence, advice.healthy(), numbers
    )


def insufficient(reason: str, evidence: list[Quote]) -> Finding:
    return Finding(OTHER, OTHER, RANK_INSUFFICIENT, reason, [], evidence, [])

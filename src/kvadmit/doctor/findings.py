"""From what a log says to findings: each with a verdict, quoted evidence and what to do.

The rules (retraction_rules.py, pool_rules.py) read what the numbers mean, not how a log words them:
* requests *wait* when the queue is substantial beside the running batch (trackers.QueueStats);
* the pool is *idle* when token usage stays under 0.7 while they wait: for 90% of the time they waited
  (lasted.py), or in 98% of the waiting samples when the log has no timestamps;
* a *prefill-bound burst* (prefill batches back to back at the prefill budget, queue falling, usage rising)
  is a healthy queue, not an idle pool; an *admission stall* that lasted (no prefill while requests finish
  and others wait) is the mark of a retraction, seen or not (lasted_rules.py);
* retraction is a *storm* when its rate exceeds ~1/min even at the low end of what the count allows,
  or comes in bursts of 5 in a minute (rates.py); otherwise it is *occasional*;
* throughput *collapses* when generation tokens/s per running request fall threefold after a retraction
  and stay there;
* a failure is *unrelated* to the KV pool when it happens with no retraction and usage under 0.9.
"""

from __future__ import annotations

from kvadmit.doctor import advice, explain
from kvadmit.doctor.collect import Collected
from kvadmit.doctor.lasted_rules import lasting_stall, of_log, prefill_bound_burst, waiting_was_a_moment
from kvadmit.doctor.model import (
    COLLAPSE,
    HEALTHY_QUEUE,
    IDLE_POOL,
    OOM_ABORT,
    OTHER,
    RANK_HEALTHY_NO_QUEUE,
    RANK_HEALTHY_WAITING,
    RANK_INSUFFICIENT,
    RANK_NOTE,
    STORM,
    Finding,
)
from kvadmit.doctor.pool_rules import FULL_USAGE, idle, oom, unrelated
from kvadmit.doctor.retraction_rules import collapse, retraction, stall, vllm_preemption
from kvadmit.doctor.trackers import Quote, unique


def log_findings(c: Collected, pool_from_metrics: float | None = None) -> list[Finding]:
    c.lasted.finish(c.whole_seconds)
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
    # A burst that prefill works through at its budget is not an idle pool, however low usage starts.
    burst = prefill_bound_burst(c)
    waiting_idle = idle(c) if arithmetic is None and burst is None else None
    if waiting_idle is not None:
        found.append(waiting_idle)
    _add_stall(found, lasting_stall(c))
    verdicts = {f.verdict for f in found}
    stalled = any(f.kind == "admission-stall" and f.verdict for f in found)  # then the queue is not healthy
    if not verdicts & {STORM, IDLE_POOL} and not stalled and c.queue.with_queue_info:
        found.append(burst if burst is not None else _healthy(c, pool, note, arithmetic))
    elif not verdicts and not c.queue.with_queue_info:
        full = _full_without_queue(c)
        if full is not None:
            found.append(full)
    return found


def _add_stall(found: list[Finding], lasting: Finding | None) -> None:
    """A stall that lasted leads (as a retraction's doing) unless a worse verdict holds; the stall noted
    after a retraction in the log gives way to it, or stays when a storm explains it already."""
    if lasting is None:
        return
    noted = [f for f in found if f.kind == "admission-stall"]
    if lasting.verdict is None or {f.verdict for f in found} & {STORM, COLLAPSE, OOM_ABORT}:
        if noted:
            return  # the stall noted after the retraction in the log says it already
        lasting.verdict, lasting.rank = None, RANK_NOTE
    for f in noted:
        found.remove(f)
    found.append(lasting)


# -- healthy -------------------------------------------------------------------------------------------


def _healthy(c: Collected, pool: int | None, note: str, arithmetic: list[str] | None) -> Finding:
    q = c.queue
    retraction = "" if not c.retract.events else ", apart from the retraction noted below"
    moment = q.waiting > 0 and waiting_was_a_moment(c)
    if q.waiting == 0 or moment:
        max_q = q.max_queue[0] if q.max_queue else 0
        top = q.max_usage
        usage = f", token usage up to {top[0]:.2f}" if top else ""
        title = f"Healthy: no request waits (#queue-req at most {max_q:,}{usage})"
        lines = [
            f"Every arrival is admitted at once{retraction}: the queue never builds beside the running "
            "batch, so admission is not holding anyone back."
        ]
        if moment:
            waited = of_log(c, c.lasted.waiting_s)
            title = f"Healthy: requests waited only {waited} (#queue-req at most {max_q:,}{usage})"
            lines = [
                f"Arrivals are admitted{retraction}: a queue built beside the running batch only "
                f"{waited}, so that moment is not the state that lasted; admission is not holding "
                "requests back."
            ]
        elif max_q:
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
    lt = c.lasted
    low, top = lt.usage_quantile(0.1), lt.usage_quantile(0.9)
    if high is None and q.max_usage is None and top is None:
        # The lines carry no token usage at all (cut from a pasted terminal, say): say what they do show.
        title = "Healthy queue: requests wait and are admitted pass by pass (the lines carry no token usage)"
        lines.insert(0, "No batch line carries a token usage, so how full the pool is cannot be read here.")
    if lt.timed and low is not None and top is not None:
        # The usage that lasted (10th to 90th percentile over the time they waited), not the fullest moment.
        usage = f"{low:.2f}" if low == top else f"{low:.2f}–{top:.2f}"
        waited = of_log(c, lt.waiting_s)
        title += f" (token usage {usage} while they wait, {waited})"
        lines.append(
            f"Requests waited {waited}; over that time token usage was {usage} (the 10th to 90th "
            f"percentile by time), at most {high:.2f}."
            if high is not None
            else f"Requests waited {waited}."
        )
    elif high is not None:
        title += f" (token usage up to {high:.2f} while they wait)"
    title += retraction
    evidence = unique([c.startup_quote, q.first_wait, q.high_wait[1] if q.high_wait else None, q.last_wait])
    numbers: dict[str, object] = {
        "pool": pool,
        "waiting_samples": q.waiting,
        "usage_peak_waiting": q.usage_quantile(0.98),
        "usage_lasting": [lt.usage_quantile(0.1), lt.usage_quantile(0.9)] if lt.timed else None,
        "waiting_s": round(lt.waiting_s, 3) if lt.timed else None,
    }
    if shape is not None:
        numbers.update(
            running_at_once=shape.running, prompt_len=shape.prompt_len, max_new_tokens=shape.max_new_tokens
        )
    return Finding(
        HEALTHY_QUEUE, HEALTHY_QUEUE, RANK_HEALTHY_WAITING, title, lines, evidence, advice.healthy(), numbers
    )


def _full_without_queue(c: Collected) -> Finding | None:
    """Lines with no #queue-req (shortened by hand, say) whose pool is full on every one, with no
    retraction: whether requests wait cannot be read, but it does not matter, as either way admission
    does what it should: a request that waits, waits for room the running requests hold."""
    q = c.queue
    low, top = q.min_usage, q.max_usage
    if low is None or top is None or low < FULL_USAGE or c.retract.events or c.vllm.warnings:
        return None
    usage = f"{low:.2f}" if low == top[0] else f"{low:.2f}–{top[0]:.2f}"
    title = (
        f"Healthy as far as the lines show: the pool is full of running requests (token usage {usage} on "
        "every line) and nothing retracts; the lines carry no queue size"
    )
    lines = [
        "No line carries #queue-req, so whether requests wait cannot be read. With the pool full and no "
        "retraction it does not change the verdict: a request that waits, waits for room the running "
        "requests hold, which is the forecast doing its job, and the running requests keep theirs.",
    ]
    return Finding(
        HEALTHY_QUEUE,
        HEALTHY_QUEUE,
        RANK_HEALTHY_WAITING,
        title,
        lines,
        [top[1]],
        advice.full_without_queue(),
        {"usage_min": low, "usage_max": top[0], "queue_known": False},
    )


def insufficient(reason: str, evidence: list[Quote], lines: list[str] | None = None) -> Finding:
    return Finding(OTHER, OTHER, RANK_INSUFFICIENT, reason, lines or [], evidence, [])

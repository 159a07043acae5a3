"""Retraction (and vLLM's preemption): occasional or a storm, the admission stall after one, and a
throughput collapse that stays after one.

* a *storm* is a rate above ~1/min even at the low end of what the count allows, or 5 within one minute
  (rates.py); without timestamps, many retractions among few decode lines; otherwise *occasional*;
* throughput *collapses* when generation tokens/s per running request fall threefold after a retraction
  and stay there.
"""

from __future__ import annotations

from kvadmit.doctor import advice
from kvadmit.doctor.collect import Collected
from kvadmit.doctor.model import (
    COLLAPSE,
    OCCASIONAL,
    RANK_COLLAPSE,
    RANK_NOTE,
    RANK_OCCASIONAL,
    RANK_STORM,
    STORM,
    Finding,
)
from kvadmit.doctor.rates import Rate, duration, per_minute
from kvadmit.doctor.trackers import Quote, unique

COLLAPSE_FACTOR = 3.0


def _retraction_rate(c: Collected) -> Rate:
    """Events over the log's whole span; no rate when the retraction lines carry no timestamps."""
    return Rate(c.retract.events, c.span_s if c.retract.first_t is not None else None)


DENSE_DECODE_LINES = 20  # one retraction per this many decode lines or fewer: ≥ 1/min at < 75 ms per step


def _dense_without_time(c: Collected) -> bool:
    """Without timestamps: retractions among decode lines, each printed every 40 decode steps (about a
    second at typical step times). One per 20 decode lines is more than one a minute for any step under
    75 ms."""
    decodes = c.kinds.get("decode", 0)
    return c.retract.events >= 5 and decodes > 0 and c.retract.events * DENSE_DECODE_LINES >= decodes


def retraction(c: Collected) -> Finding | None:
    r = c.retract
    if r.events == 0:
        if r.forced:
            return Finding(
                "test-retraction",
                None,
                RANK_NOTE,
                f"{r.forced} forced test retractions (SGLANG_TEST_RETRACT): not a capacity signal",
            )
        return None
    rate = _retraction_rate(c)
    storm = rate.is_storm(r.peak_per_minute)
    where = _rate_words(rate, "retraction", r.peak_per_minute, " of log")
    lines = []
    if rate.seconds is None and _dense_without_time(c):
        storm = True
        where += f", but among only {c.kinds.get('decode', 0):,} decode lines"
        lines.append(
            "A decode line is printed every 40 decode steps (--decode-log-interval), about a second at "
            f"typical step times; {r.events:,} retractions among {c.kinds.get('decode', 0):,} of them is at "
            "least one per 800 decode steps, more than once a minute unless a step takes over 75 ms."
        )
    if r.duplicate_lines:
        lines.append(
            f"The log has {r.events + r.duplicate_lines} retraction lines: under tensor parallelism every "
            "rank prints the same event, so lines with the same time and text from different ranks count "
            f"once ({', '.join(sorted(r.ranks)[:8])})."
        )
    if r.biggest_jump is not None:
        _, old, new, _ = r.biggest_jump
        floor = (
            f" {r.from_floor} of them came after the ratio had decayed to its floor (≤ 0.10)."
            if r.from_floor > 1
            else " It came after the ratio had decayed to its floor (≤ 0.10)."
            if r.from_floor
            else ""
        )
        lines.append(
            "Each retraction re-estimates the new-token ratio from the survivors' progress; the largest "
            f"jump was {old:.4f} -> {new:.4f}.{floor} A retraction means the forecast let in more than the "
            "pool could finish: the retracted requests lose their KV and prefill again later."
        )
    if c.failures.count("health_fail"):
        lines.append(f"Health checks failed {c.failures.count('health_fail')} times in this log as well.")
    numbers = {
        "events": r.events,
        "requests": r.requests,
        "lines": r.events + r.duplicate_lines,
        "span_s": rate.seconds,
        "per_minute": rate.per_minute,
        "per_minute_low": rate.per_minute_low,
        "peak_per_minute": r.peak_per_minute,
        "max_new_ratio": r.max_new_ratio,
    }
    evidence = unique(
        [
            c.stall.before_quote,  # how full the pool was just before the first one
            r.first,
            r.biggest_jump[3] if r.biggest_jump else None,
            r.last,
            *c.failures.quotes.get("health_fail", [])[:1],
        ]
    )
    if storm:
        title = f"Retraction storm: {where}"
        return Finding(
            STORM, STORM, RANK_STORM, title, lines, evidence, advice.storm(c.stall.running_before), numbers
        )
    title = f"Occasional retraction: {where}"
    lines.append(
        "SGLang's tuning guide calls a retraction about once a minute or less fine: the forecast corrects "
        "itself (the ratio jumps, admission gets careful) and carries on."
    )
    return Finding(
        OCCASIONAL, OCCASIONAL, RANK_OCCASIONAL, title, lines, evidence, advice.occasional(), numbers
    )


def _rate_words(rate: Rate, what: str, peak: int, span: str) -> str:
    k = rate.events
    noun = what if k == 1 else what + "s"
    if rate.seconds is None:
        return f"{k:,} {noun} (no timestamps to give a rate)"
    pm, low = rate.per_minute, rate.per_minute_low
    assert pm is not None and low is not None
    text = f"{k:,} {noun} in {duration(rate.seconds)}{span}, {per_minute(pm)} per minute"
    tolerated = "the ~1/min SGLang's tuning guide calls fine"
    if rate.is_storm(peak):
        if low > 1.0:
            text += f" (at least {per_minute(low)}/min allowing for chance), above {tolerated}"
        else:
            text += f", with {peak} within one minute: a burst above {tolerated}"
    elif pm > 1.0:
        text += f": too few to call a storm (the true rate could be as low as {per_minute(low)}/min)"
    return text


def vllm_preemption(c: Collected) -> Finding | None:
    v = c.vllm
    if not v.warnings or v.last is None or v.first is None:
        return None
    t_last, cum_last, q_last = v.last
    t_first, cum_first, _ = v.first
    if cum_last is not None and v.start_t is not None and t_last is not None and t_last > v.start_t:
        rate = Rate(cum_last, t_last - v.start_t)
        basis = "since the run began (from its progress bar's elapsed time)"
    elif (
        cum_last is not None
        and cum_first is not None
        and v.warnings > 1
        and t_first is not None
        and t_last is not None
        and t_last > t_first
    ):
        rate = Rate(cum_last - cum_first, t_last - t_first)
        basis = "between the first and last warning"
    else:
        events = cum_last if cum_last is not None else 50 * v.warnings
        rate = Rate(events, None)
        basis = "since the server started (no time base for a rate)"
    swapped = ""
    if v.max_swapped is not None and v.max_swapped[0] > 0:
        swapped = f"; up to {v.max_swapped[0]:,} requests sat swapped out at once"
    where = _rate_words(rate, "preemption", 0, "")
    lines = [
        f"vLLM counts {rate.events:,} preemptions {basis}{swapped}.",
        "vLLM V0 prints this warning once per 50 preemptions, so each warning line stands for 50. A "
        "preemption is vLLM's retraction: the request's KV is swapped out or dropped and recomputed.",
    ]
    storm = rate.is_storm() or (
        rate.seconds is None and v.max_swapped is not None and v.max_swapped[0] > 0 and v.warnings >= 2
    )
    evidence = unique([v.first[2], q_last, v.max_swapped[1] if v.max_swapped else None])
    numbers = {
        "preemptions": rate.events,
        "seconds": rate.seconds,
        "per_minute": rate.per_minute,
        "modes": sorted(v.modes),
    }
    if storm:
        return Finding(
            STORM,
            STORM,
            RANK_STORM,
            f"Preemption storm (vLLM): {where}",
            lines,
            evidence,
            advice.vllm_storm(),
            numbers,
        )
    return Finding(
        OCCASIONAL,
        OCCASIONAL,
        RANK_OCCASIONAL,
        f"Occasional preemption (vLLM): {where}",
        lines,
        evidence,
        advice.occasional(),
        numbers,
    )


def stall(c: Collected) -> Finding | None:
    s = c.stall
    if not s.started or s.samples_after < 2 or s.running_before is None or s.queued_before is None:
        return None
    if s.last_running is None or s.last_queued is None:
        return None
    drop = s.running_before - s.last_running
    if not (s.last_queued > s.queued_before and drop > 0 and drop >= 0.1 * s.running_before):
        return None
    if s.admitted_after >= drop:
        return None
    admitted = (
        f"{s.prefills_after} prefill batches admitted {s.admitted_after} requests"
        if s.prefills_after
        else "no prefill batch ran"
    )
    ratio = f" (up to {c.retract.max_new_ratio:.4f})" if c.retract.max_new_ratio else ""
    lines = [
        f"After the first retraction #queue-req grew {s.queued_before:,} → {s.last_queued:,} while "
        f"#running-req fell {s.running_before:,} → {s.last_running:,} and {admitted}.",
        f"Each retraction reset the ratio higher{ratio}, so every running request holds back a larger share "
        "of its remaining max_new_tokens and nothing new fits until some finish: the retractions turned "
        "into an admission stall, and time to first token grows with the queue.",
    ]
    return Finding(
        "admission-stall",
        None,
        RANK_NOTE,
        f"Admission stalled after the retractions: queue {s.queued_before:,} → {s.last_queued:,}, running "
        f"{s.running_before:,} → {s.last_running:,}",
        lines,
        unique([s.before_quote, c.retract.first, s.last_quote]),
        [],
        {
            "queued_before": s.queued_before,
            "queued_after": s.last_queued,
            "running_before": s.running_before,
            "running_after": s.last_running,
            "admitted_after": s.admitted_after,
        },
    )


def collapse(c: Collected) -> Finding | None:
    t = c.collapse
    if t.baseline is None or t.after < 3 or t.worst_after is None or (t.retraction is None and not t.unseen):
        return None
    if t.after_low < 0.75 * t.after or len(t.recent) < 3:
        return None
    if t.retraction is None and t.prefills_after >= t.after:
        return None  # prefill passes took the time: decode starved by prefill, not a collapse
    base, base_q = t.baseline
    if any(per * COLLAPSE_FACTOR > base for per, _ in t.recent):
        return None  # it recovered
    now = sorted(per for per, _ in t.recent)[1]
    since = "before the first retraction" if t.retraction is not None else "before the fall"
    lines = [
        f"Generation throughput per running request was {base:.1f} tokens/s {since} and "
        f"{now:.1f} tokens/s at the end of the log ({base / max(now, 1e-9):.0f}× lower); {t.after_low} of "
        f"the {t.after} decode lines after it stayed at a third or less.",
        "Per running request, so fewer running requests do not explain it: each request decodes slower. A "
        "retraction should cost one re-prefill, not the rest of the run (a user saw 429 → 20–38 tokens/s "
        "after a retraction, and it stayed there).",
    ]
    title = f"Throughput collapse after a retraction: {base:.1f} → {now:.1f} tokens/s per running request"
    if t.retraction is None:
        title, more = _unseen_collapse(c, base, now)
        lines.insert(1, more)
    low = t.first_low  # the first slow line, when no retraction line marks the start
    first_low = Quote(low.line, low.text) if low is not None and t.retraction is None else None
    evidence = unique([base_q, t.retraction, first_low, t.worst_after[1], t.recent[-1][1]])
    return Finding(
        COLLAPSE,
        COLLAPSE,
        RANK_COLLAPSE,
        title,
        lines,
        evidence,
        advice.collapse(),
        {
            "per_request_before": base,
            "per_request_after": now,
            "samples_after": t.after,
            "retraction_seen": t.retraction is not None,
        },
    )


def _unseen_collapse(c: Collected, base: float, now: float) -> tuple[str, str]:
    """Title and a line for a fall with no retraction line in the excerpt."""
    t = c.collapse
    low = t.first_low
    assert low is not None
    running = f"{t.running_before} → {low.running}" if t.running_before is not None else f"{low.running}"
    title = (
        f"Throughput collapse: {base:.1f} → {now:.1f} tokens/s per running request while #running-req went "
        f"{running} (no retraction line in the excerpt)"
    )
    line = (
        f"Total generation throughput fell threefold or more while no fewer requests ran (#running-req "
        f"{running}): that is not a batch finishing."
    )
    u0, u1 = t.usage_before, low.usage
    if u0 is not None and u1 is not None and u1 < u0:
        line += (
            f" Token usage fell {u0:.2f} → {u1:.2f} at the same moment while #running-req did not fall: "
            "KV was freed from running requests, which is what a retraction does; look for 'KV cache pool "
            "is full. Retract requests.' just before the slow lines."
        )
    return title, line

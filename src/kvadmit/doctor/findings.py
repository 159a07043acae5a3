"""From what a log says to findings: each with a verdict, quoted evidence and what to do.

The rules read what the numbers mean, not how a particular log words them:
* requests *wait* when the queue is substantial beside the running batch (trackers.waiting);
* the pool is *idle* when token usage stays under 0.7 (90% of the waiting samples) while they wait;
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
    COLLAPSE,
    HEALTHY_QUEUE,
    IDLE_POOL,
    OCCASIONAL,
    OOM_ABORT,
    OTHER,
    RANK_COLLAPSE,
    RANK_HEALTHY_NO_QUEUE,
    RANK_HEALTHY_WAITING,
    RANK_IDLE,
    RANK_INSUFFICIENT,
    RANK_NOTE,
    RANK_OCCASIONAL,
    RANK_OOM,
    RANK_STORM,
    RANK_UNRELATED_FAILURE,
    STORM,
    Finding,
)
from kvadmit.doctor.rates import Rate, duration, per_minute
from kvadmit.doctor.trackers import LOW_USAGE, Quote

FULL_USAGE = 0.9  # SGLang's guide: above this the pool is well used
COLLAPSE_FACTOR = 3.0
CAP_SHARE = 0.6  # waiting samples at one running count that make a flat line


def _unique(quotes: list[Quote | None]) -> list[Quote]:
    seen: set[int] = set()
    out = []
    for q in quotes:
        if q is not None and q.line not in seen:
            seen.add(q.line)
            out.append(q)
    return sorted(out, key=lambda q: q.line)


def kv_pressure(c: Collected) -> bool:
    top = c.queue.max_usage[0] if c.queue.max_usage else 0.0
    return (
        c.retract.events > 0
        or c.vllm.warnings > 0
        or top >= FULL_USAGE
        or c.failures.count("last_request") > 0
    )


def log_findings(c: Collected, pool_from_metrics: float | None = None) -> list[Finding]:
    pool, note = explain.pool_size(c, pool_from_metrics)
    shape = c.waves.shape()
    arithmetic = explain.wave_arithmetic(c, shape, pool) if shape is not None and pool else None
    found: list[Finding] = []
    for rule in (_oom, _collapse, _retraction, _vllm_preemption, _stall, _unrelated):
        f = rule(c)
        if f is not None:
            found.append(f)
    # When the admission rule itself explains how many run (a whole request more does not fit), the pool
    # is not idle however low its usage looks between waves.
    idle = _idle(c) if arithmetic is None else None
    if idle is not None:
        found.append(idle)
    verdicts = {f.verdict for f in found}
    if not verdicts & {STORM, IDLE_POOL} and c.queue.with_queue_info:
        found.append(_healthy(c, pool, note, arithmetic))
    return found


# -- out of memory -------------------------------------------------------------------------------------


def _oom(c: Collected) -> Finding | None:
    fail = c.failures
    last, gpu = fail.count("last_request"), fail.count("gpu_oom")
    if not last and not gpu:
        return None
    lines: list[str] = []
    if last:
        releases = sorted(r for r in fail.releases if r)
        lines.append(
            "Retraction removed every other running request and the last one still did not fit: that one "
            "request's prompt plus outputs outgrew the KV pool by itself."
        )
        lines.extend(advice.LAST_REQUEST_WORDING[r] for r in releases if r in advice.LAST_REQUEST_WORDING)
    if gpu:
        lines.append(
            "The GPU allocator itself ran out of memory (activations, CUDA graphs, or another process): "
            "this is not the KV pool's admission, which never hands out more slots than the pool has."
        )
    pool = c.startup.get("max_total_num_tokens")
    title_bits = []
    if last:
        graceful = fail.graceful
        crashed = last - graceful
        parts = [
            f"{graceful} aborted" if graceful else "",
            f"{crashed} crashed the scheduler" if crashed else "",
        ]
        title_bits.append("out of memory with one request left (" + ", ".join(p for p in parts if p) + ")")
    if gpu:
        title_bits.append(f"GPU out of memory ({gpu}×)")
    evidence = _unique(
        [
            *fail.quotes.get("last_request", []),
            *fail.quotes.get("gpu_oom", []),
            *fail.quotes.get("traceback", [])[:1],
            c.retract.last,
            c.startup_quote,
        ]
    )
    return Finding(
        OOM_ABORT,
        OOM_ABORT,
        RANK_OOM,
        "Out-of-memory: " + "; ".join(title_bits),
        lines,
        evidence,
        advice.oom(bool(last), bool(gpu), pool if isinstance(pool, int) else None),
        {
            "last_request_failures": last,
            "graceful_aborts": fail.graceful,
            "gpu_oom": gpu,
            "releases": sorted(fail.releases),
        },
    )


# -- retraction ----------------------------------------------------------------------------------------


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


def _retraction(c: Collected) -> Finding | None:
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
    evidence = _unique(
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


def _vllm_preemption(c: Collected) -> Finding | None:
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
    evidence = _unique([v.first[2], q_last, v.max_swapped[1] if v.max_swapped else None])
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


def _stall(c: Collected) -> Finding | None:
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
        _unique([s.before_quote, c.retract.first, s.last_quote]),
        [],
        {
            "queued_before": s.queued_before,
            "queued_after": s.last_queued,
            "running_before": s.running_before,
            "running_after": s.last_running,
            "admitted_after": s.admitted_after,
        },
    )


# -- throughput ------------------------------------------------------------------------------------------


def _collapse(c: Collected) -> Finding | None:
    t = c.collapse
    if t.baseline is None or t.after < 3 or t.worst_after is None or t.retraction is None:
        return None
    if t.after_low < 0.75 * t.after or len(t.recent) < 3:
        return None
    base, base_q = t.baseline
    if any(per * COLLAPSE_FACTOR > base for per, _ in t.recent):
        return None  # it recovered
    now = sorted(per for per, _ in t.recent)[1]
    lines = [
        f"Generation throughput per running request was {base:.1f} tokens/s before the first retraction and "
        f"{now:.1f} tokens/s at the end of the log ({base / max(now, 1e-9):.0f}× lower); {t.after_low} of "
        f"the {t.after} decode lines after it stayed at a third or less.",
        "Per running request, so fewer running requests do not explain it: each request decodes slower. A "
        "retraction should cost one re-prefill, not the rest of the run (a user saw 429 → 20–38 tokens/s "
        "after a retraction, and it stayed there).",
    ]
    evidence = _unique([base_q, t.retraction, t.worst_after[1], t.recent[-1][1]])
    return Finding(
        COLLAPSE,
        COLLAPSE,
        RANK_COLLAPSE,
        f"Throughput collapse after a retraction: {base:.1f} → {now:.1f} tokens/s per running request",
        lines,
        evidence,
        advice.collapse(),
        {"per_request_before": base, "per_request_after": now, "samples_after": t.after},
    )


# -- idle pool -------------------------------------------------------------------------------------------


def _idle(c: Collected) -> Finding | None:
    q = c.queue
    if q.waiting == 0:
        return None
    # The peak (98th percentile, so one odd line does not decide) of usage while requests wait: a pool the
    # forecast fills reaches high usage at some point, an idle one never does.
    peak = q.usage_quantile(0.98)
    stuck = q.stuck > 0 and (peak is None or peak < 0.05)
    if not stuck and (peak is None or peak >= LOW_USAGE):
        return None
    low_usage, low_quote = q.low_wait if q.low_wait else (0.0, q.first_wait)
    max_queue = q.max_queue[0] if q.max_queue else 0
    if q.waiting == 1 and q.first_wait is not None:
        title_usage = f"token usage {low_usage:.2f} while {max_queue:,} requests wait"
    else:
        title_usage = (
            f"token usage never above {peak:.2f} in the {q.waiting:,} moments requests waited (up to "
            f"{max_queue:,} queued)"
        )
    cause, lines, extra = _idle_cause(c, stuck)
    evidence = _unique([low_quote, q.first_wait, q.last_wait, *extra])
    return Finding(
        IDLE_POOL,
        IDLE_POOL,
        RANK_IDLE,
        f"Idle pool with a queue: {title_usage}",
        lines,
        evidence,
        advice.idle(cause, c),
        {"cause": cause, "usage_peak_waiting": peak, "waiting_samples": q.waiting, "max_queue": max_queue},
    )


def _idle_cause(c: Collected, stuck: bool) -> tuple[str, list[str], list[Quote | None]]:
    q = c.queue
    lines = [
        "Requests wait although most of the KV pool is unused (SGLang's guide: below 0.9 with a queue, the "
        "server is too conservative). Admission counts reservations, not use, so something reserves or "
        "blocks far more than the running requests need."
    ]
    cap = c.startup.get("max_running_requests")
    flat = q.flat_running()
    budget = _prefill_budget_note(c)
    if stuck:
        lines.append(
            "Nothing is running and the pool is empty, yet requests wait: no reservation explains that. The "
            "scheduler is blocked or its accounting is wrong (a bug to report with this log), not the "
            "forecast."
        )
        return "blocked", lines, [q.stuck_quote]
    if (
        c.retract.events
        and q.low_after_retraction >= max(1, q.waiting // 2)
        and (c.retract.max_new_ratio or 0) >= 0.3
    ):
        lines.append(
            f"It follows retraction: the ratio was pushed up to {c.retract.max_new_ratio:.4f}, so each "
            "running request holds back that share of its whole remaining max_new_tokens; it decays back "
            "over 600 decode steps, and every further retraction pushes it up again."
        )
        return (
            "ratio-after-retraction",
            lines,
            [c.retract.biggest_jump[3] if c.retract.biggest_jump else None, q.low_after_quote],
        )
    if flat is not None and (
        (isinstance(cap, int) and flat[0] >= cap) or (q.waiting >= 3 and flat[1] >= CAP_SHARE)
    ):
        value, share = flat
        at_cap = f" = --max-running-requests {cap}" if isinstance(cap, int) and value >= cap else ""
        lines.append(
            f"#running-req sits flat at {value:,}{at_cap} in {share:.0%} of the moments requests waited: a "
            "cap on the number of running requests, not the KV pool, holds them back."
        )
        return "max-running-requests", lines, []
    lines.append(
        "No retraction pushed the ratio up and #running-req is not flat at a cap, so the likely cause is "
        "oversized max_new_tokens: each running request reserves its remaining max_new_tokens × the ratio, "
        "and requests that stop far earlier leave that space reserved but unused."
    )
    if q.waiting < 3:
        lines.append(
            "From so few lines the causes cannot be fully told apart: a #running-req flat over time would "
            "mean the --max-running-requests cap, retraction lines would mean a pushed-up ratio."
        )
    if budget is not None:
        lines.append(budget[0])
        return "max-new-tokens", lines, [budget[1]]
    return "max-new-tokens", lines, []


# Chunked-prefill sizes SGLang picks by GPU memory when --chunked-prefill-size is not given (§6).
_DEFAULT_CHUNKS = (2048, 4096, 8192, 16384)


def _prefill_budget_note(c: Collected) -> tuple[str, Quote] | None:
    """A prefill batch exactly at an input budget: the queue is admitted at most that many tokens a pass."""
    top = c.prefill.max_new_token
    if top is None:
        return None
    tokens, q = top
    budgets: list[tuple[int, str]] = []
    for key, flag in (
        ("max_prefill_tokens", "--max-prefill-tokens"),
        ("chunked_prefill_size", "--chunked-prefill-size"),
    ):
        value = c.startup.get(key)
        if isinstance(value, int) and value > 0:
            budgets.append((value, flag))
    if not c.startup:
        budgets += [(16384, "the default --max-prefill-tokens")]
        budgets += [(size, "a default --chunked-prefill-size") for size in _DEFAULT_CHUNKS]
    for value, flag in budgets:
        if tokens == value:
            return (
                f"A prefill batch took {tokens:,} new tokens, exactly {flag} ({value:,}): each prefill pass "
                "is capped by that input budget (a long prompt is prefilled in chunks of it), which limits "
                "how fast the queue can be admitted.",
                q,
            )
    return None


# -- failures unrelated to the pool ----------------------------------------------------------------------


def _unrelated(c: Collected) -> Finding | None:
    f = c.failures
    kinds = {k: f.count(k) for k in ("health_fail", "abort", "error", "http_5xx") if f.count(k)}
    if not kinds or kv_pressure(c) or f.count("gpu_oom"):
        return None
    words = {
        "health_fail": "failed health checks",
        "abort": "aborted requests",
        "error": "errors",
        "http_5xx": "HTTP 5xx answers",
    }
    _singular = {
        "health_fail": "failed health check",
        "abort": "aborted request",
        "error": "error",
        "http_5xx": "HTTP 5xx answer",
    }
    what = ", ".join(f"{k:,} {words[name] if k > 1 else _singular[name]}" for name, k in kinds.items())
    top = c.queue.max_usage
    usage = f"token usage never above {top[0]:.2f}" if top else "no token usage reported"
    lines = [
        f"{what.capitalize()}, with {usage} and no retraction: the KV pool was never under pressure, so "
        "admission is not the cause.",
    ]
    if f.health_probes:
        lines.append(
            f"The log shows {f.health_probes:,} health probe{'s' if f.health_probes > 1 else ''} (/health or "
            "/health_generate). In SGLang each /health_generate sends a real 1-token generation through the "
            "scheduler; frequent probing during long idle periods preceded a crash in a public report "
            "(sgl-project/sglang#3695)."
        )
    evidence = _unique(
        [
            *f.quotes.get("health_fail", []),
            *f.quotes.get("abort", []),
            *f.quotes.get("error", []),
            *f.quotes.get("http_5xx", []),
            top[1] if top else None,
        ]
    )
    return Finding(
        OTHER,
        OTHER,
        RANK_UNRELATED_FAILURE,
        f"Failures unrelated to the KV pool: {what}; admission is not the cause",
        lines,
        evidence[:6],
        advice.unrelated(),
        {**kinds, "health_probes": f.health_probes},
    )


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
        evidence = _unique([q.max_usage[1] if q.max_usage else None, q.max_queue[1] if q.max_queue else None])
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
    evidence = _unique([c.startup_quote, q.first_wait, q.high_wait[1] if q.high_wait else None, q.last_wait])
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

"""The pool: out-of-memory failures, an idle pool while requests wait (and which cause), and failures
with no KV pressure at all (so admission is not the cause).

* the pool is *idle* when token usage stays under 0.7 while they wait (the 90th percentile over the time
  they waited, lasted.py; the 98th of the moments they waited when the log has no timestamps), and they
  waited for a quarter of the time or more;
* a failure is *unrelated* to the KV pool when it happens with no retraction and usage under 0.9.
"""

from __future__ import annotations

from kvadmit.doctor import advice
from kvadmit.doctor.collect import Collected
from kvadmit.doctor.lasted_rules import STALL_NOTE_SHARE, of_log, seconds, waiting_was_a_moment
from kvadmit.doctor.model import (
    CAP_CAUSE,
    IDLE_POOL,
    OOM_ABORT,
    OTHER,
    RANK_IDLE,
    RANK_OOM,
    RANK_UNRELATED_FAILURE,
    Finding,
)
from kvadmit.doctor.trackers import LOW_USAGE, Quote, unique

FULL_USAGE = 0.9  # SGLang's guide: above this the pool is well used
CAP_SHARE = 0.6  # waiting samples at one running count that make a flat line


def kv_pressure(c: Collected) -> bool:
    top = c.queue.max_usage[0] if c.queue.max_usage else 0.0
    return (
        c.retract.events > 0
        or c.vllm.warnings > 0
        or top >= FULL_USAGE
        or c.failures.count("last_request") > 0
        or c.failures.count("kv_alloc") > 0
    )


def oom(c: Collected) -> Finding | None:
    fail = c.failures
    last, gpu, alloc = fail.count("last_request"), fail.count("gpu_oom"), fail.count("kv_alloc")
    if not last and not gpu and not alloc:
        return None
    lines: list[str] = []
    if last:
        releases = sorted(r for r in fail.releases if r)
        lines.append(
            "Retraction removed every other running request and the last one still did not fit: that one "
            "request's prompt plus outputs outgrew the KV pool by itself."
        )
        lines.extend(advice.LAST_REQUEST_WORDING[r] for r in releases if r in advice.LAST_REQUEST_WORDING)
    if alloc:
        lines.extend(_kv_alloc_lines(c))
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
    if alloc:
        title_bits.append(f"the KV pool could not allocate a batch ({alloc}×, the scheduler crashed)")
    if gpu:
        title_bits.append(f"GPU out of memory ({gpu}×)")
    evidence = unique(
        [
            *fail.quotes.get("last_request", []),
            *fail.quotes.get("kv_alloc", []),
            *fail.quotes.get("kv_alloc_detail", []),
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
        advice.oom(bool(last), bool(gpu), pool if isinstance(pool, int) else None, bool(alloc)),
        {
            "last_request_failures": last,
            "kv_alloc_failures": alloc,
            "kv_alloc_asked": fail.kv_alloc_asked,
            "kv_alloc_free": fail.kv_alloc_free,
            "graceful_aborts": fail.graceful,
            "gpu_oom": gpu,
            "releases": sorted(fail.releases),
        },
    )


def _kv_alloc_lines(c: Collected) -> list[str]:
    """What SGLang's "… out of memory. Try to lower your batch size." means: the pool's allocator refused
    the slots a batch needed after admission (and, in decode, the memory check) had let the batch through."""
    fail = c.failures
    phases = {"decode": "a decode step", "prefill": "a prefill batch"}
    step = " or ".join(phases[p] for p in sorted(fail.kv_alloc_phases) if p in phases) or "a batch"
    asked, free = fail.kv_alloc_asked, fail.kv_alloc_free
    numbers = (
        f" ({asked:,} tokens asked for, {free:,} free)" if asked is not None and free is not None else ""
    )
    lines = [
        f"SGLang's KV allocator could not hand out the slots {step} needed{numbers}, after the scheduler's "
        "own checks (admission; before a decode step, the memory check that retracts) had let it through: "
        "the RuntimeError kills the scheduler, and every request on the server fails with it."
    ]
    if asked is not None and free is not None and asked <= free:
        # Fewer tokens asked for than were free: only a page-granular (or draft-slot) shortfall explains it.
        lines.append(
            f"It asked for fewer tokens than were free ({asked:,} ≤ {free:,}): the slots go out in whole "
            "pages (--page-size above 1), and a step in which many requests each start a new page needs a "
            "page for each, which checks that count tokens miss. Public reports tie this to --page-size "
            "above 1 (sgl-project/sglang#4602, #7411) and to speculative decoding with retraction (#14942)."
        )
    return lines


def idle(c: Collected) -> Finding | None:
    q = c.queue
    if q.waiting == 0:
        return None
    lt = c.lasted
    if waiting_was_a_moment(c):
        return None  # a queue for a moment beside an idle pool is arrivals, not requests held back
    timed = lt.timed and lt.usage_quantile(0.9) is not None
    # The usage that lasted while requests waited: a pool the forecast fills stays high for a good part of
    # the time (waves fill it towards their end), an idle one does not, whatever one moment shows. By
    # time (90th percentile) when the log has timestamps; else by samples (98th, so one odd line does not
    # decide).
    peak = lt.usage_quantile(0.9) if timed else q.usage_quantile(0.98)
    stuck = q.stuck > 0 and (peak is None or peak < 0.05)
    if not stuck and (peak is None or peak >= LOW_USAGE):
        return None
    low_usage, low_quote = q.low_wait if q.low_wait else (0.0, q.first_wait)
    max_queue = q.max_queue[0] if q.max_queue else 0
    lasted = ""
    if q.waiting == 1 and q.first_wait is not None:
        title_usage = f"token usage {low_usage:.2f} while {max_queue:,} requests wait"
    elif timed:
        below = lt.share_below(LOW_USAGE) * lt.waiting_s
        lasted = (
            f"Token usage stayed under {LOW_USAGE:.2f} for {seconds(below)} of the {seconds(lt.waiting_s)} "
            "in which requests waited"
        )
        top = q.high_wait[0] if q.high_wait else peak
        lasted += f"; its fullest moment ({top:.2f}) did not last." if top >= LOW_USAGE else "."
        title_usage = (
            f"token usage {peak:.2f} or less for 90% of the time requests waited, "
            f"{of_log(c, lt.waiting_s)} (up to {max_queue:,} queued)"
        )
    else:
        title_usage = (
            f"token usage never above {peak:.2f} in the {q.waiting:,} moments requests waited (up to "
            f"{max_queue:,} queued)"
        )
    cause, lines, extra = _idle_cause(c, stuck)
    if lasted:
        lines.insert(1, lasted)
    evidence = unique([low_quote, q.first_wait, q.last_wait, *extra])
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
    lt = c.lasted
    stalled = lt.longest is not None and c.prefill.batches and lt.stalled_s >= STALL_NOTE_SHARE * lt.timed_s
    if not c.retract.events and stalled and lt.longest is not None:
        st = lt.longest
        lines.append(
            f"No retraction line is in this log, but admission stood still {of_log(c, lt.stalled_s)} while "
            "running requests finished and usage fell: what a retraction leaves behind, a new-token ratio "
            "pushed up that decays back over about 600 decode steps (the retraction came before the excerpt)."
        )
        return "ratio-after-retraction", lines, [st.top_q, st.last_q]
    if flat is not None and (
        (isinstance(cap, int) and flat[0] >= cap) or (q.waiting >= 3 and flat[1] >= CAP_SHARE)
    ):
        value, share = flat
        at_cap = f" = --max-running-requests {cap}" if isinstance(cap, int) and value >= cap else ""
        lines.append(
            f"#running-req sits flat at {value:,}{at_cap} in {share:.0%} of the moments requests waited: a "
            "cap on the number of running requests, not the KV pool, holds them back."
        )
        return CAP_CAUSE, lines, []
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


def unrelated(c: Collected) -> Finding | None:
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
    evidence = unique(
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

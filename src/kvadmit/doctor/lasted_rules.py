"""Findings from the state that lasted (lasted.py): a prefill-bound burst, an admission stall after a
retraction (seen or not), and how long a state held, in words.

* a *prefill-bound burst*: while requests wait, prefill batches outnumber decode lines (they run back to
  back), at least three quarters of them take exactly a prefill budget's worth of new tokens
  (--chunked-prefill-size or --max-prefill-tokens, or a default when the start-up line is not in the log),
  the queue falls and token usage rises: requests wait for prefill compute, not for room in the pool;
* an *admission stall*: stretches of waiting with no prefill while requests finish (lasted.Stretch) that
  add up to at least STALL_SHARE of the time the batch lines cover (STALL_NOTE_SHARE: a note). A
  retraction leaves exactly this behind (it sets the new-token ratio high and the ratio decays by a small
  fixed step per decode step, docs/sglang-rules.md §2), so it is read as one even when its line is outside
  the excerpt;
* requests that wait for less than WAIT_SHARE of that time wait for a moment: no idle pool, and a healthy
  verdict that says so.
"""

from __future__ import annotations

from kvadmit.doctor import advice
from kvadmit.doctor.collect import Collected
from kvadmit.doctor.lasted import LastedTracker
from kvadmit.doctor.model import (
    HEALTHY_QUEUE,
    OCCASIONAL,
    RANK_HEALTHY_WAITING,
    RANK_NOTE,
    RANK_STALL,
    Finding,
)
from kvadmit.doctor.rates import duration
from kvadmit.doctor.trackers import Quote, unique

# Of the log's span: a stall for most of it is the state that lasted (the verdict); for a good part of it,
# a note beside the verdict; for less, a moment.
STALL_SHARE = 0.5
STALL_NOTE_SHARE = 0.3
WAIT_SHARE = 0.25  # requests waiting for less of the time than this: a moment, not the state that lasted
BURST_AT_BUDGET = 0.75
# Without a start-up line, passes within 5% of one size larger than any default budget (16,384) show a
# budget the user set and the log does not print: each pass takes what that budget allows.
STEADY_SPREAD = 0.05
# Chunked-prefill sizes SGLang picks by GPU memory, and the default --max-prefill-tokens (§6).
_DEFAULT_BUDGETS = ((2048, 4096, 8192, 16384), 16384)


def seconds(x: float) -> str:
    """A duration for a sentence: tenths of a second under 90 s."""
    return f"{x:.1f} s" if x < 90 else duration(x)


def _count(k: int, noun: str, plural: str = "s") -> str:
    return f"{k:,} {noun}" if k == 1 else f"{k:,} {noun}{plural}"


def lasted_words(part: float, whole: float | None, what: str = "excerpt") -> str:
    """'for 7.1 s of the 9.0 s excerpt', both in the unit of the whole."""
    if whole is None or whole <= 0:
        return f"for {seconds(part)}"
    part = min(part, whole)
    if whole < 90:
        return f"for {seconds(part)} of the {seconds(whole)} {what}"
    unit, scale = ("min", 60) if whole < 5400 else ("h", 3600)
    return f"for {part / scale:.1f} {unit} of the {whole / scale:.1f} {unit} {what}"


def of_log(c: Collected, part: float) -> str:
    """How long of the time the batch lines cover: the excerpt's span, less long silences (a server with
    nothing to run prints no batch line; lasted.GAP_CAP_S)."""
    whole, span = c.lasted.timed_s, c.span_s
    return lasted_words(part, whole, "excerpt" if span and whole >= 0.9 * span else "of batch lines")


def waiting_was_a_moment(c: Collected) -> bool:
    """Requests waited for less than WAIT_SHARE of the time: the queue is not the state that lasted."""
    lt = c.lasted
    return lt.timed and lt.waiting_s < WAIT_SHARE * lt.timed_s


# -- the prefill-bound burst ---------------------------------------------------------------------------


def _budgets(c: Collected) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for key, name in (("chunked_prefill_size", "chunk"), ("max_prefill_tokens", "prefill")):
        value = c.startup.get(key)
        if isinstance(value, int) and value > 0:
            found.append((value, name))
    if not c.startup:
        chunks, prefill = _DEFAULT_BUDGETS
        found = [(size, "chunk") for size in chunks] + [(prefill, "prefill")]
    return found


def _at_budget(lt: LastedTracker, budget: int, kind: str) -> tuple[int, Quote] | None:
    """(passes, a quoted one) of the waiting prefills at `budget`: exactly it for a chunk budget; for
    --max-prefill-tokens, which admits whole prompts, also a pass that one more prompt of the pass's mean
    size would not fit (SGLang refuses the next prompt when it is at least what is left, §6)."""
    exact = lt.new_tokens.get(budget)
    count, quote = exact if exact is not None else (0, None)
    if kind == "prefill":
        for (tokens, seqs), (k, q) in lt.pass_shapes.items():
            if tokens != budget and tokens < budget <= tokens + tokens / seqs:
                count, quote = count + k, quote or q
    return (count, quote) if quote is not None else None


def _steady_size(c: Collected) -> tuple[int, int, str, Quote] | None:
    """(batches, median size, "steady", a quoted one) when at least BURST_AT_BUDGET of the prefills that
    ran while requests waited took within STEADY_SPREAD of the same number of new tokens, larger than any
    default budget, and the log has no start-up line: a budget the user set that the log does not print."""
    lt = c.lasted
    sizes = sorted(lt.new_tokens.items())
    total = sum(k for _, (k, _) in sizes)
    if total < 3:
        return None
    half, seen, median = total / 2, 0, sizes[-1][0]
    for size, (k, _) in sizes:
        seen += k
        if seen >= half:
            median = size
            break
    near = [(size, kq) for size, kq in sizes if abs(size - median) <= STEADY_SPREAD * median]
    count = sum(k for _, (k, _) in near)
    # Only a size no budget explains: with a start-up line the budgets are known (a steady pass under them
    # is admission holding back), and a pass under SGLang's largest default may be admission too.
    if (
        c.startup
        or median <= _DEFAULT_BUDGETS[1]
        or count < 3
        or count < BURST_AT_BUDGET * lt.waiting_prefills
    ):
        return None
    return count, median, "steady", next(kq[1] for size, kq in near if size == median)


def _size_words(kind: str, budget: int) -> tuple[str, str]:
    """How the title and the explanation name the size every pass took."""
    if kind == "steady":
        return (
            f"a steady {budget:,} new tokens",
            f"within 5% of {budget:,} new tokens, more than any default budget allows (a "
            "--max-prefill-tokens or --chunked-prefill-size set to about that, not printed in this log)",
        )
    if kind == "chunk":
        return f"the {budget:,}-token chunk budget", f"exactly {budget:,} new tokens (--chunked-prefill-size)"
    return (
        f"the {budget:,}-token prefill budget",
        f"{budget:,} new tokens or as close to it as whole prompts allow (--max-prefill-tokens)",
    )


def prefill_bound_burst(c: Collected) -> Finding | None:
    lt = c.lasted
    first, last = lt.first_wait, lt.last_wait
    if lt.waiting_prefills < 2 or first is None or last is None or lt.waiting_prefills * 2 < lt.waiting_lines:
        return None
    best: tuple[int, int, str, Quote] | None = None  # (batches at it, budget, kind, a quoted one)
    for value, kind in _budgets(c):
        at = _at_budget(lt, value, kind)
        if at is not None and (best is None or at[0] > best[0]):
            best = (at[0], value, kind, at[1])
    if best is None or best[0] < 2 or best[0] < BURST_AT_BUDGET * lt.waiting_prefills:
        best = _steady_size(c)
        if best is None:
            return None
    at, budget, kind, at_quote = best
    t0, q0, u0, first_q = first
    t1, q1, u1, last_q = last
    # Nothing but prefill passes at the full budget while requests waited: prefill compute is the bound
    # even when the queue did not shrink and the pool did not fill in the excerpt (one long prompt in
    # chunks, arrivals keeping pace, requests that finish as soon as they are prefilled). Two such passes
    # are enough then; otherwise three, with the queue falling and usage rising.
    only_full_passes = kind != "steady" and at == lt.waiting_prefills == lt.waiting_lines
    if u0 is None or u1 is None or (not only_full_passes and (at < 3 or q1 >= q0 or u1 <= u0)):
        return None
    every = "every prefill" if at == lt.waiting_prefills else f"{at:,} of {lt.waiting_prefills:,} prefills"
    took = f" in {seconds(t1 - t0)}" if t0 is not None and t1 is not None and t1 > t0 else ""
    size, taking = _size_words(kind, budget)
    rising = u1 > u0
    title = (
        f"Healthy queue: a prefill-bound burst, {every} at {size}, queue {q0:,} → {q1:,}{took}, usage "
        f"{'rising ' if rising else ''}{u0:.2f} → {u1:.2f}"
    )
    queue = f"fell {q0:,} → {q1:,}" if q1 < q0 else f"went {q0:,} → {q1:,}"
    pool = (
        f"token usage rose {u0:.2f} → {u1:.2f}: the pool is still filling"
        if rising
        else f"token usage stayed at {u1:.2f}: requests leave about as fast as they are prefilled"
    )
    lines = [
        f"Prefill is the bottleneck: {lt.waiting_prefills:,} prefill batches ran back to back while requests "
        f"waited, {every} taking {taking}, so each pass took in as much as it allows"
        + (
            "."
            if q1 < q0
            else "; the queue does not shrink while every pass is full (one long prompt split into chunks, "
            "or arrivals keeping pace)."
        ),
        f"The queue {queue} while {pool}, and the requests wait for prefill passes, not for room the "
        "admission forecast holds back. Low usage here is the burst not yet prefilled, not an idle pool.",
    ]
    if lt.timed:
        lines.append(f"Requests waited {of_log(c, lt.waiting_s)}.")
    return Finding(
        "prefill-bound-burst",
        HEALTHY_QUEUE,
        RANK_HEALTHY_WAITING,
        title,
        lines,
        unique([c.startup_quote, first_q, at_quote, last_q]),
        advice.prefill_bound(),
        {
            "budget": budget,
            "prefills_waiting": lt.waiting_prefills,
            "prefills_at_budget": at,
            "queue_first": q0,
            "queue_last": q1,
            "usage_first": u0,
            "usage_last": u1,
        },
    )


# -- the admission stall -------------------------------------------------------------------------------


def lasting_stall(c: Collected) -> Finding | None:
    """Waiting with no prefill while requests finish, for a good part of the log: a stall that lasted."""
    lt = c.lasted
    st = lt.longest
    span = lt.timed_s
    # A log with no prefill line at all (a PD decode worker's: its requests arrive by KV transfer) cannot
    # show that nobody was admitted.
    if st is None or not lt.timed or not c.prefill.batches or lt.stalled_s < STALL_NOTE_SHARE * span:
        return None
    lasted = lt.stalled_s >= STALL_SHARE * span
    r = c.retract
    u1 = st.usage1 if st.usage1 is not None else 0.0
    top = max(st.top, u1)
    running = (
        f"#running-req fell {st.running0:,} → {st.running1:,}"
        if st.running0 is not None and st.running1 is not None and st.running1 < st.running0
        else "requests finished"
    )
    many = f" in {lt.stalls} stretches" if lt.stalls > 1 else ""
    lines = [
        f"Requests waited (#queue-req {st.queued0:,} → {st.queued1:,}) and no prefill ran for "
        f"{seconds(st.seconds)} while {running} and token usage fell {top:.2f} → {u1:.2f}: room freed up "
        f"and nobody was admitted. Admission stood still {of_log(c, lt.stalled_s)}{many}.",
    ]
    if lt.prefills_after:
        still = (
            f"; usage stayed well under {top:.2f} for {seconds(lt.trickle_s)} more while requests waited"
            if lt.trickle_s > 0
            else ""
        )
        lines.append(
            f"Then admission resumed at a trickle: {_count(lt.prefills_after, 'prefill batch', 'es')} "
            f"admitted {_count(lt.admitted_after, 'request')} in the rest of the log{still}."
        )
    else:
        lines.append("No prefill ran after it for the rest of the log.")
    lines.append(_ratio_line(c))
    when = "after a retraction" if r.events else "after a retraction (before the excerpt)"
    title = (
        f"Admission stalled {when}: no prefill for {seconds(st.seconds)} while {st.queued1:,} requests "
        f"waited and token usage fell {top:.2f} → {u1:.2f}, {of_log(c, lt.stalled_s)}"
    )
    evidence = unique(
        [
            r.biggest_jump[3] if r.biggest_jump else None,
            st.top_q,
            st.last_q,
            lt.first_after,
        ]
    )
    return Finding(
        "admission-stall",
        OCCASIONAL if lasted else None,
        RANK_STALL if lasted else RANK_NOTE,
        title,
        lines,
        evidence,
        advice.stall_after_retraction(st.running0),
        {
            "stalled_s": round(lt.stalled_s, 3),
            "trickle_s": round(lt.trickle_s, 3),
            "span_s": round(span, 3),
            "longest_s": round(st.seconds, 3),
            "queued_before": st.queued0,
            "queued_after": st.queued1,
            "running_before": st.running0,
            "running_after": st.running1,
            "usage_top": top,
            "usage_after": st.usage1,
            "prefills_after": lt.prefills_after,
            "admitted_after": lt.admitted_after,
            "retraction_seen": bool(r.events),
        },
    )


def _ratio_line(c: Collected) -> str:
    """What raised the ratio: the retraction in the log, or one just before the excerpt."""
    r = c.retract
    if r.events and r.max_new_ratio is not None:
        return (
            f"The retraction pushed the new-token ratio up to {r.max_new_ratio:.4f}; it decays only by a "
            "small fixed step per decode step (about 0.001 by default, over 600 steps), so until then every "
            "running request holds back that share of its remaining max_new_tokens and the forecast admits "
            "nobody although the pool is not full."
        )
    return (
        "No retraction line is in this excerpt, but this is what one leaves behind: a retraction "
        "sets the new-token ratio from the survivors' progress (often 0.3 to 1.0, against a floor of "
        "0.098), and it decays only by (init − min) / 600 per decode step (about 0.001 by default), so "
        "for hundreds of decode steps every running request holds back a large share of its remaining "
        "max_new_tokens and the forecast admits nobody although the pool is not full. Look for 'KV "
        "cache pool is full. Retract requests.' just before the excerpt."
    )

"""How many identical requests run at once in a pool, and why — computed by the real admission code on
constructed snapshots, then explained with the arithmetic of the rules."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvadmit.capacity.snapshot import RunningSpec, Snapshot, WaitingSpec, build_scheduler
from kvadmit.config import ServerArgs
from kvadmit.memory.pool import ceil_page
from kvadmit.scheduler.output_budget import grant_max_new_tokens, max_request_len
from kvadmit.scheduler.ratio import NewTokenRatio


class CapacityError(ValueError):
    """The question has no answer (a prompt that can never fit the pool, say); the message says why."""


@dataclass(frozen=True, slots=True)
class FitQuestion:
    args: ServerArgs
    input_len: int
    output_len: int
    ignore_eos: bool = True
    ratio: float | None = None  # the new-token ratio to assume (default: the schedule's)


def _snapshot(q: FitQuestion, running: int, waiting: int, ratio: float, output_so_far: int) -> Snapshot:
    r = RunningSpec("", q.input_len, output_so_far, q.output_len, q.ignore_eos)
    w = WaitingSpec("", q.input_len, 0, q.output_len, q.ignore_eos, 0)
    return Snapshot(
        args=q.args,
        new_token_ratio=ratio,
        evictable_tokens=0,
        running=tuple(replace(r, rid=f"run{i}") for i in range(running)),
        waiting=tuple(replace(w, rid=f"new{i}") for i in range(waiting)),
        check="admission",
    )


def first_pass(q: FitQuestion) -> int:
    """Requests admitted in one pass from an empty pool (each is charged its full reservation)."""
    pool = q.args.max_total_tokens or 0
    sched = build_scheduler(_snapshot(q, 0, min(pool // max(q.input_len, 1) + 2, 100_000), 1.0, 0))
    record = sched.run_admission()
    return len(record.adder.can_run_list) if record.adder else 0


def running_at_once(q: FitQuestion, ratio: float) -> int:
    """The largest n such that an n-th request is admitted while n − 1 run, each just started (one
    output token, so it holds back its whole remaining output × its ratio)."""
    pool = q.args.max_total_tokens or 0

    def admits(n: int) -> bool:
        if n <= 1:
            return True
        sched = build_scheduler(_snapshot(q, n - 1, 1, ratio, 1))
        if sched.max_running_requests < n:
            return False
        record = sched.run_admission()
        return bool(record.adder and record.adder.can_run_list)

    lo, hi = 1, max(pool // (q.input_len + 1) + 1, 1)
    while lo < hi:  # largest n with admits(n); admission only gets harder as n grows
        mid = (lo + hi + 1) // 2
        if admits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def validate(q: FitQuestion) -> None:
    pool = q.args.max_total_tokens
    if pool is None:
        raise CapacityError("--max-total-tokens is required")
    if q.input_len <= 0:
        raise CapacityError(f"--input-len must be a positive integer, got {q.input_len}")
    if q.output_len <= 0:
        raise CapacityError(f"--output-len must be a positive integer, got {q.output_len}")
    page = q.args.page_size
    smallest = ceil_page(q.input_len, page) + page + 1
    if smallest >= pool:
        raise CapacityError(
            f"a {q.input_len:,}-token prompt can never fit a {pool:,}-token pool: it needs its prompt, "
            f"one page and one output token ({smallest:,} tokens) below the pool size"
        )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _granted(q: FitQuestion) -> tuple[FitQuestion, list[str]]:
    """The question with max_new_tokens as the server grants it on arrival, so that a request fits an
    empty pool (docs/sglang-rules.md §1.9), and a note when that is less than asked."""
    pool = q.args.max_total_tokens or 0
    context = q.args.context_length or pool
    granted = grant_max_new_tokens(
        q.output_len,
        q.input_len,
        max_req_len=max_request_len(context, pool),
        pool_size=pool,
        page_size=q.args.page_size,
    )
    if granted >= q.output_len:
        return q, []
    note = (
        f"The server caps max_new_tokens {q.output_len:,} at {granted:,} on arrival (a request must fit an "
        f"empty {pool:,}-token pool with its prompt and one page), so that is what it reserves."
    )
    return replace(q, output_len=granted), [note]


def explain_fit(q: FitQuestion) -> dict[str, object]:
    """The answer as data and as sentences."""
    validate(q)
    q, lines = _granted(q)
    args = q.args
    pool = args.max_total_tokens or 0
    page = args.page_size
    clip = args.knobs.clip_max_new_tokens_estimation
    reserved = min(q.output_len, clip)
    charge = ceil_page(q.input_len, page) + page + reserved
    admitted = first_pass(q)
    lines += [
        f"Each new request must fit its uncached prompt ({q.input_len:,}) plus its max_new_tokens "
        f"clipped to {clip:,} ({reserved:,}) plus one page ({page}): "
        f"{q.input_len + reserved + page:,} tokens, strictly less than what remains of the "
        f"{pool:,}-token pool.",
        f"Admitted, it is charged {charge:,} tokens, so from an empty pool one pass admits {admitted}: "
        f"{admitted} × {charge:,} = {admitted * charge:,}, leaving {pool - admitted * charge:,}, "
        f"less than the {q.input_len + reserved + page:,} the next one needs.",
    ]
    result: dict[str, object] = {
        "max_total_tokens": pool,
        "per_request_tokens": q.input_len + q.output_len,
        "first_pass_admitted": admitted,
    }
    if q.ignore_eos and (q.ratio is None or args.profile.ignore_eos_reserves_in_full):
        n = running_at_once(q, 1.0)
        result["running_at_once"] = n
        if q.ratio is not None:
            lines.append(
                f"(--ratio {q.ratio} does not apply: SGLang {args.profile.name} reserves in full for "
                "ignore_eos requests; add --no-ignore-eos for requests that stop early.)"
            )
        lines.append(
            f"With ignore_eos every request generates all {q.output_len:,} tokens, so a running request "
            f"holds back its whole remaining output (ratio 1.0): {n} run at once; a {_ordinal(n + 1)} would "
            "need "
            f"{n + 1} × ({q.input_len:,} + {q.output_len:,}) = {(n + 1) * (q.input_len + q.output_len):,} "
            f"tokens of the {pool:,}-token pool."
        )
        return {**result, "explanation": lines}
    result["by_ratio"] = _explain_by_ratio(q, lines)
    return {**result, "explanation": lines}


def _explain_by_ratio(q: FitQuestion, lines: list[str]) -> list[dict[str, object]]:
    """Without ignore_eos: how many run at once as the new-token ratio decays (or at the assumed ratio);
    the table, its sentences appended to `lines`."""
    args = q.args
    pool = args.max_total_tokens or 0
    tracker = NewTokenRatio.from_config(args.schedule_conservativeness, args.knobs)
    steps = args.knobs.new_token_ratio_decay_steps
    if q.ratio is not None:
        points = [(None, q.ratio)]
    else:
        points = [
            (s, max(tracker.init - s * tracker.decay, tracker.min)) for s in range(0, steps + 1, steps // 6)
        ]
    table: list[dict[str, object]] = []
    for step, ratio in points:
        n = running_at_once(q, ratio)
        table.append({"decode_steps": step, "new_token_ratio": round(ratio, 6), "running_at_once": n})
    lines.append(
        "Without ignore_eos a running request holds back only its remaining max_new_tokens × the new-token "
        f"ratio, which starts at {tracker.init:.3f} and falls by {tracker.decay:.7f} per decode step to "
        f"{tracker.min:.3f} after {steps} steps, so admission grows bolder the longer decoding goes well:"
    )
    for row in table:
        when = "at the assumed ratio" if row["decode_steps"] is None else f"after {row['decode_steps']} steps"
        lines.append(
            f"  {when}: ratio {row['new_token_ratio']:.4f} → {row['running_at_once']} requests run at once"
        )
    full = table[-1]["running_at_once"]
    if isinstance(full, int) and full * (q.input_len + q.output_len) > pool:
        lines.append(
            f"If all {full} really generated {q.output_len:,} tokens they would need "
            f"{full * (q.input_len + q.output_len):,} of {pool:,}: the pool fills during decode and the "
            "scheduler retracts (fewest outputs first) and resets the ratio."
        )
    return table

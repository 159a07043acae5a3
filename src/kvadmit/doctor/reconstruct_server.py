"""The server's side of a reconstruction from its log alone: the pool, the prefill budgets, the request
cap and the cost model (calibrate's fit of the batch lines; docs/sglang-rules.md §4 for the lines)."""

from __future__ import annotations

import math
import statistics

from kvadmit.config import ServerArgs
from kvadmit.costmodel.calibrate import CalibrationError, calibrate
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.doctor.inferred import Inferred
from kvadmit.doctor.observed import Decode, Observed

USAGE_HALF_STEP = 0.005  # token usage is printed with 2 decimals: the true ratio is within ± this
RATIO_FLOOR_AT_1 = 0.7 * 0.14  # the new-token ratio's floor at --schedule-conservativeness 1 (0.0980)
RATIO_FLOOR_MAX = 0.14 + 0.00005  # min(0.7 × c, 1) × 0.14 never exceeds 0.14 (printed with 4 decimals)


def startup_int(obs: Observed, name: str) -> int | None:
    v = obs.startup.get(name)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def infer_pool(obs: Observed) -> tuple[Inferred[int], tuple[int, int]] | None:
    """The pool in tokens: the start-up line's max_total_num_tokens, or what every Decode line's
    #token ÷ token usage allows. Usage u is printed rounded, so pool lies in [#token / (u + 0.005),
    #token / (u − 0.005)], and never below #token itself; the lines together narrow that interval."""
    told = startup_int(obs, "max_total_num_tokens")
    if told:
        return Inferred(told, "the start-up line's max_total_num_tokens", "exact"), (told, told)
    lo, hi, n = 0.0, math.inf, 0
    for d in obs.decodes:
        if d.tokens is None or d.usage is None or d.usage <= 0 or d.tokens <= 0:
            continue
        n += 1
        lo = max(lo, d.tokens, d.tokens / (d.usage + USAGE_HALF_STEP))
        if d.usage > USAGE_HALF_STEP:
            hi = min(hi, d.tokens / (d.usage - USAGE_HALF_STEP))
    if n == 0:
        return None
    low, high = math.ceil(lo), math.floor(hi) if hi < math.inf else math.ceil(lo * 1.01)
    if low > high:  # the lines disagree (several pools, or a different rounding): the median ratio
        ratios = [d.tokens / d.usage for d in obs.decodes if d.tokens and d.usage and d.usage >= 0.1]
        value = round(statistics.median(ratios)) if ratios else low
        how = f"#token ÷ token usage, the median over {len(ratios)} Decode lines (the lines disagree)"
        return Inferred(value, how, "guess"), (value, value)
    value = (low + high) // 2
    how = (
        f"#token ÷ token usage on {n:,} Decode lines: between {low:,} and {high:,} tokens "
        "(usage is printed with 2 decimals)"
    )
    return Inferred(value, how, "exact" if low == high else "estimate"), (low, high)


def infer_chunked_prefill(obs: Observed) -> Inferred[int | None]:
    told = startup_int(obs, "chunked_prefill_size")
    if told is not None:
        return Inferred(told, "the start-up line's chunked_prefill_size", "exact")
    # A cap shows as several multi-request Prefill batches cut at the same #new-token, the largest seen.
    top = max((p.new_token for p in obs.prefills), default=0)
    hits = sum(1 for p in obs.prefills if p.new_token == top and p.new_seq >= 2)
    if hits >= 2:
        how = f"{hits} Prefill batches of several requests capped at #new-token {top:,}"
        return Inferred(top, how, "estimate")
    return Inferred(None, "not shown (no prefill batch hit a cap): the default for the device", "guess")


def infer_max_prefill(obs: Observed) -> Inferred[int]:
    told = startup_int(obs, "max_prefill_tokens")
    if told is not None:
        return Inferred(told, "the start-up line's max_prefill_tokens", "exact")
    default = ServerArgs().max_prefill_tokens
    return Inferred(default, f"not shown: SGLang's default {default:,}", "guess")


def infer_max_running(obs: Observed) -> Inferred[int | None]:
    """The request cap: the start-up line's, or #running-req flat at its maximum while requests wait."""
    told = startup_int(obs, "max_running_requests")
    if told is not None:
        return Inferred(told, "the start-up line's max_running_requests", "exact")
    # Flat at the top with a queue and room in the pool: a full pool would hold requests back as well.
    seen = [(d.running, d.queue or 0, d.usage or 0.0) for d in obs.decodes]
    if seen:
        top = max(r for r, _, _ in seen)
        flat = [u for r, q, u in seen if r == top and q > 0]
        if len(flat) >= 5 and top > 1 and max(flat) < 0.8:
            how = f"#running-req stays at {top} on {len(flat)} Decode lines while requests wait"
            how += " and the pool has room"
            return Inferred(top, how, "estimate")
    how = "no cap seen (#running-req never stays flat at a maximum while requests wait and the pool has room)"
    return Inferred(None, how, "guess")


def infer_cost(obs: Observed, decode_log_interval: int) -> Inferred[CostModel]:
    """calibrate's fit of the Decode/Prefill lines; without enough lines, one step time from the
    Decode lines' gen throughput (#running-req tokens per step).

    The fit chooses its terms strictly (fit.py's "strict"): a term must cut the error by over ln(n) ÷ n
    of it. The replay times prefill batches of other sizes than the log's usual one, where a prefill base
    and a per-token cost part ways: on the early-stop round trip (every prefill one 200–400-token prompt,
    ~360 windows each ±4% from the requests joining and leaving mid-window) calibrate's own selection
    kept a base that cut the error by 1.0% (seed 3: 2.0 ms + tokens ÷ 156,430/s against the truth's
    tokens ÷ 80,000/s; with 6,000 requests the base is dropped and the rate 84,418/s), so a batch of two
    cost 5.8 ms where it takes 7.5 ms and the replay's TTFT tail was short. Strictly: 0 + tokens ÷
    80,087/s. Calibrate's own users compare throughput, where the split does not matter; it keeps FPE."""
    try:
        cal = calibrate([("log", obs.batch_texts)], decode_log_interval, selection="strict")
    except CalibrationError as e:
        steps = [d.running / d.gen_throughput for d in obs.decodes if d.gen_throughput and d.running]
        step_ms = 1000 * statistics.median(steps) if steps else 20.0
        how = f"calibrate could not fit ({e}); one decode step of {step_ms:.2f} ms"
        return Inferred(CostModel.simple(step_ms, 10_000.0), how, "guess")
    d, p = cal.cost.decode, cal.cost.prefill
    how = (
        f"kvadmit calibrate on {len(cal.windows)} Decode windows: decode step {d.base_ms:.3f} ms + "
        f"{d.per_request_ms:.4f} ms × #running-req + {d.per_kv_token_ms:.6f} ms × #token; prefill "
        f"{p.base_ms:.3f} ms + tokens / {p.tokens_per_s:,.0f} tokens/s"
    )
    return Inferred(cal.cost, how, "estimate")


def _told(obs: Observed, name: str) -> str | None:
    return obs.server_args.get(name)


EXACT_SHARE = 0.95  # of the pairs that must agree for an exact interval


def infer_decode_log_interval(obs: Observed) -> Inferred[int]:
    """--decode-log-interval: the server_args line's; or, between two Decode lines with nothing between
    them (no prefill, no retraction) and the same #running-req B, every request gained one token a step,
    so #token grew by interval × B exactly (a finish would lower B, an admission print a Prefill line)."""
    told = _told(obs, "decode_log_interval")
    if told is not None and told.isdigit() and int(told) > 0:
        return Inferred(int(told), "the server_args line's decode_log_interval", "exact")
    seen: dict[int, int] = {}
    prev: Decode | None = None
    for e in obs.events:
        if not isinstance(e, Decode):
            prev = None
            continue
        same = prev is not None and e.running == prev.running
        if same and prev is not None and prev.tokens is not None and e.tokens is not None:
            grown = e.tokens - prev.tokens
            if e.running > 0 and grown > 0 and grown % e.running == 0:
                seen[grown // e.running] = seen.get(grown // e.running, 0) + 1
        prev = e
    default = ServerArgs().decode_log_interval
    if not seen:
        how = f"not shown (no two Decode lines back to back, same #running-req): SGLang's default {default}"
        return Inferred(default, how, "guess")
    value, hits = max(seen.items(), key=lambda kv: (kv[1], -kv[0]))
    pairs = sum(seen.values())
    how = (
        f"#token grew by exactly {value} × #running-req between {hits} of {pairs} pairs of back-to-back "
        "Decode lines with the same #running-req"
    )
    # Exact when at least 2 pairs and 95% of them agree: over thousands of steps the overlap loop leaves
    # the odd pair off (1 of 115 on a 2,400-request simulated log: 35 × 35 where 40 × 35 was due).
    return Inferred(value, how, "exact" if hits >= 2 and hits >= EXACT_SHARE * pairs else "estimate")


def infer_conservativeness(obs: Observed) -> Inferred[float]:
    """--schedule-conservativeness: the server_args line's; or the floor the ratio decayed to before a
    retraction (the retraction line's old ratio): the floor is min(0.7 × c, 1) × 0.14 (docs/sglang-rules.md
    §2), 0.0980 at c = 1, and no floor exceeds 0.14."""
    told = _told(obs, "schedule_conservativeness")
    if told is not None:
        try:
            return Inferred(float(told), "the server_args line's schedule_conservativeness", "exact")
        except ValueError:
            pass
    olds = [r.old_ratio for r in obs.retracts if r.old_ratio is not None and r.old_ratio > 0]
    low = min(olds, default=None)
    if low is not None and low < RATIO_FLOOR_MAX:
        value = round(low / RATIO_FLOOR_AT_1, 2)
        how = (
            f"the ratio had decayed to its floor {low:.4f} before a retraction: floor = 0.7 × c × 0.14, "
            f"so c = {low:.4f} ÷ 0.098"
        )
        return Inferred(value, how, "estimate")
    how = "not shown (no server_args line, no ratio at its floor): SGLang's default 1.0"
    return Inferred(1.0, how, "guess")


def infer_overlap(obs: Observed) -> Inferred[bool | None]:
    """Whether the server ran SGLang's overlap loop: the server_args line's disable_overlap_schedule."""
    told = _told(obs, "disable_overlap_schedule")
    if told in ("True", "False"):
        overlap = told == "False"
        how = f"the server_args line's disable_overlap_schedule={told}"
        return Inferred(overlap, how, "exact")
    how = "not shown in the log (no server_args line): simulated with the simulator's default loop"
    return Inferred(None, how, "guess")

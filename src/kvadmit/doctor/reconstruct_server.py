"""The server's side of a reconstruction from its log alone: the pool, the prefill budgets, the request
cap and the cost model (calibrate's fit of the batch lines; docs/sglang-rules.md §4 for the lines)."""

from __future__ import annotations

import math
import statistics

from kvadmit.config import ServerArgs
from kvadmit.costmodel.calibrate import CalibrationError, calibrate
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.doctor.inferred import Inferred
from kvadmit.doctor.observed import Observed

USAGE_HALF_STEP = 0.005  # token usage is printed with 2 decimals: the true ratio is within ± this


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
    Decode lines' gen throughput (#running-req tokens per step)."""
    try:
        cal = calibrate([("log", obs.batch_texts)], decode_log_interval)
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

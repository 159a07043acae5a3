"""The fleet's verdict from its replicas' states (fleet.py), and the router setting that explains it.

* *imbalance*: some replicas retract, queue or fail (pressed) while others have no queue (calm);
* *held back*: every replica queues with its KV pool mostly unused (each one's own verdict is
  idle-pool-with-queue): a setting of each replica (a --max-running-requests cap, too conservative a
  reservation) holds requests back, and more replicas would repeat that limit rather than lift it;
* *overloaded*: every replica is pressed otherwise: the fleet is short of capacity, whatever the router
  does;
* *healthy*: no replica is pressed (the split of requests is still reported when it is uneven).

The router is not in the replicas' logs, so its part is read from how the requests were split
(requests admitted per replica: prefill admissions less re-admissions after retraction) and what the
replicas' prefix caches supplied:

* *in turn*: counts at most one apart while load differs: requests dealt in turn regardless of size
  (sglang-router's round_robin, SGLang's --dp-size controller with round_robin or auto);
* *shared prefix*: the pressed replicas got more than their share (over 1.25× the calm ones' mean and at
  least 2 requests more) and their caches supplied ≥ 50% of their prompt tokens, ≥ 25 points more than
  the calm ones': cache_aware keeps a shared prefix on one replica until in-flight counts differ by more
  than --balance-abs-threshold (64) and by a factor over --balance-rel-threshold (1.5);
* *uneven draws*: more than their share without that: random's draws, or power_of_two on token loads
  polled every --worker-startup-check-interval (30 s in sglang-router 0.3.2);
* *request sizes*: otherwise (the pressed replicas got no more requests, but bigger ones).
"""

from __future__ import annotations

from kvadmit.doctor.fleet import FAILING, PRESSED, QUEUEING, RETRACTING, SILENT, ReplicaVerdict
from kvadmit.doctor.model import IDLE_POOL, RANK_NOTE, Finding
from kvadmit.doctor.trackers import Quote, unique

FLEET_IMBALANCE = "fleet-imbalance"
FLEET_OVERLOADED = "fleet-overloaded"
FLEET_HELD_BACK = "fleet-held-back"
FLEET_HEALTHY = "fleet-healthy"
FLEET_OTHER = "other"

IN_TURN = "in-turn"
SHARED_PREFIX = "shared-prefix"
UNEVEN_DRAWS = "uneven-draws"
REQUEST_SIZES = "request-sizes"
SPLIT_UNSEEN = "split-unseen"  # no Prefill lines: how requests were split is not in the logs

MORE_FACTOR = 1.25  # the pressed replicas' mean requests over the calm ones' …
MORE_AT_LEAST = 2  # … and at least this many requests more
CACHED_SHARE = 0.5
CACHED_LEAD = 0.25
DEFAULT_BALANCE_ABS = 64  # sglang-router's --balance-abs-threshold

CAUSE_TITLE = {
    IN_TURN: "requests dealt in turn (round_robin) whatever their size",
    SHARED_PREFIX: "cache_aware keeps a shared prefix on one replica",
    UNEVEN_DRAWS: "the router's choices were uneven (random, or power_of_two on stale loads)",
    REQUEST_SIZES: "the pressed replicas' requests are bigger",
    SPLIT_UNSEEN: "how the router split the requests is not in these logs",
}


def _names(rs: list[ReplicaVerdict]) -> str:
    return ", ".join(r.name for r in rs)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _cached(rs: list[ReplicaVerdict]) -> float:
    new = sum(r.numbers.new_tokens for r in rs)
    cached = sum(r.numbers.cached_tokens for r in rs)
    return cached / (new + cached) if new + cached else 0.0


def _prompt(rs: list[ReplicaVerdict]) -> float:
    admissions = sum(r.numbers.admissions for r in rs)
    tokens = sum(r.numbers.new_tokens + r.numbers.cached_tokens for r in rs)
    return tokens / admissions if admissions else 0.0


def _in_flight(rs: list[ReplicaVerdict]) -> int:
    return max((r.numbers.peak_in_flight[0] for r in rs if r.numbers.peak_in_flight), default=0)


def cause_of(
    pressed: list[ReplicaVerdict], calm: list[ReplicaVerdict], everyone: list[ReplicaVerdict]
) -> str:
    if not all(r.requests_seen for r in everyone):
        return SPLIT_UNSEEN
    requests = [r.requests for r in everyone]
    if max(requests) - min(requests) <= 1:
        return IN_TURN
    p_mean, c_mean = _mean([r.requests for r in pressed]), _mean([r.requests for r in calm])
    more = p_mean > MORE_FACTOR * c_mean and p_mean - c_mean >= MORE_AT_LEAST
    if more and _cached(pressed) >= CACHED_SHARE and _cached(pressed) - _cached(calm) >= CACHED_LEAD:
        return SHARED_PREFIX
    return UNEVEN_DRAWS if more else REQUEST_SIZES


def _describe(r: ReplicaVerdict) -> str:
    if r.state == RETRACTING:
        return f"{r.name} retracts ({r.retracted:,} requests retracted)"
    if r.state == QUEUEING:
        return f"{r.name} queues (peak queue {r.peak_queue:,})"
    return f"{r.name} fails ({r.diagnosis.verdict})"


def _top_usage(rs: list[ReplicaVerdict]) -> float | None:
    """The highest token usage any of these replicas' lines shows (None: no line shows usage)."""
    return max((r.numbers.peak_usage[0] for r in rs if r.numbers.peak_usage), default=None)


def _calm_phrase(calm: list[ReplicaVerdict]) -> str:
    top = _top_usage(calm)
    usage = f" (token usage at most {top:.2f})" if top is not None else ""
    verb = "has" if len(calm) == 1 else "have"
    silent = [r for r in calm if r.state == SILENT]
    extra = f"; {_names(silent)} admitted nothing" if silent else ""
    return f"{_names(calm)} {verb} no queue{usage}{extra}"


def _each(everyone: list[ReplicaVerdict]) -> str:
    if not all(r.requests_seen for r in everyone):
        return "requests admitted not shown: no Prefill lines"
    requests = [r.requests for r in everyone]
    lo, hi = min(requests), max(requests)
    return f"{lo:,} requests each" if lo == hi else f"{lo:,}–{hi:,} requests each"


def _split_line(everyone: list[ReplicaVerdict]) -> str:
    parts = ", ".join(f"{r.name} {r.requests:,}" if r.requests_seen else f"{r.name} -" for r in everyone)
    unseen = (
        "" if all(r.requests_seen for r in everyone) else " (-: no Prefill lines, e.g. a PD decode worker)"
    )
    return f"Requests admitted per replica: {parts}{unseen}."


def _cause_lines(cause: str, pressed: list[ReplicaVerdict], calm: list[ReplicaVerdict], n: int) -> list[str]:
    p_prompt, c_prompt = _prompt(pressed), _prompt(calm)
    p_mean, c_mean = _mean([r.requests for r in pressed]), _mean([r.requests for r in calm])
    sizes = (
        f"The pressed replicas' requests are bigger: {p_prompt:,.0f} prompt tokens per admission against "
        f"{c_prompt:,.0f} on the others (longer outputs also keep a request in the pool longer; the log "
        "does not show output lengths)."
    )
    if cause == IN_TURN:
        lines = [
            "The requests were split in turn (counts at most one apart), as sglang-router's --policy "
            "round_robin deals them, and SGLang's own --dp-size controller with --load-balance-method "
            "round_robin (or auto, without PD disaggregation): every replica gets the same number whatever "
            "each request costs.",
            sizes,
        ]
        method = _dp_setting(pressed + calm, "load_balance_method")
        if method is not None:
            size = _dp_setting(pressed + calm, "dp_size")
            dp = f"--dp-size {size}, " if size else ""
            shown = f"Its server_args line shows this server's setting: {dp}--load-balance-method {method}."
            lines.insert(1, shown)
        return lines
    if cause == SHARED_PREFIX:
        hi, lo = _in_flight(pressed), _in_flight(calm)
        gap = hi - lo
        where = (
            f"under the default --balance-abs-threshold of {DEFAULT_BALANCE_ABS}, so cache_aware never "
            "switched to the least-loaded replica"
            if gap <= DEFAULT_BALANCE_ABS
            else f"over the default {DEFAULT_BALANCE_ABS}, so cache_aware switched only once the queue "
            "had built"
        )
        share = sum(r.requests for r in pressed) / max(1, sum(r.requests for r in pressed + calm))
        return [
            f"{_names(pressed)} took {share:.0%} of the requests, and their prefix cache supplied "
            f"{_cached(pressed):.0%} of the prompt tokens they prefilled against {_cached(calm):.0%} on the "
            "others: the mark of sglang-router's --policy cache_aware (its default), which sends a request "
            "to the replica whose cached text it matches beyond --cache-threshold (0.3) unless the "
            "in-flight requests differ by more than --balance-abs-threshold (64) and by a factor over "
            "--balance-rel-threshold (1.5).",
            f"Here the busiest replica held at most {hi:,} requests (running + queued) and the others at "
            f"most {lo:,}: a gap of {gap:,}, {where}.",
        ]
    if cause == SPLIT_UNSEEN:
        return [
            "Without Prefill lines the logs do not show how many requests each replica admitted, so the "
            "router's part cannot be read from them; compare the router's own per-worker counts (smg and "
            "sglang-router export them on --prometheus-port)."
        ]
    if cause == UNEVEN_DRAWS:
        return [
            f"{_names(pressed)} got {p_mean:,.1f} requests each against {c_mean:,.1f} on the others, "
            f"without a shared prefix to explain it (the prefix cache supplied {_cached(pressed):.0%} of "
            "their prompt tokens): the router's choices were uneven. random's draws do this; so does "
            "power_of_two, which compares token loads polled every --worker-startup-check-interval "
            "seconds (30 in sglang-router 0.3.2): until the next poll, the replica that looked lightest "
            "wins every draw it is in.",
        ]
    return [
        f"{_names(pressed)} got no more requests than the others ({p_mean:,.1f} each against {c_mean:,.1f}).",
        sizes,
    ]


def _dp_setting(rs: list[ReplicaVerdict], name: str) -> str | None:
    """A DP controller setting the replicas' server_args lines agree on (None if none shows it)."""
    values = {r.dp_args[name] for r in rs if name in r.dp_args}
    return values.pop() if len(values) == 1 else None


def _advice(cause: str, pressed: list[ReplicaVerdict], calm: list[ReplicaVerdict], n: int) -> list[str]:
    load_aware = (
        "Route on load rather than count: sglang-router's --policy power_of_two (the lighter of two "
        "random workers by token load) or cache_aware (the fewest requests in flight when no prefix is "
        "shared); under SGLang's --dp-size, --load-balance-method total_tokens balances the ranks on tokens."
    )
    check = f"Try it on this workload first: kvadmit simulate --replicas {n} --router POLICY (same flags)."
    if cause in (IN_TURN, REQUEST_SIZES, SPLIT_UNSEEN):
        return [load_aware, check]
    if cause == SHARED_PREFIX:
        held = [r.numbers.held_at_first_queue for r in pressed if r.numbers.held_at_first_queue]
        gap = _in_flight(pressed) - _in_flight(calm)
        abs_threshold = max(1, min(held) - 1) if held else max(1, gap // 2)
        why = (
            f"below the {min(held):,} requests {_names(pressed)} held when a queue first formed"
            if held
            else "below the gap seen here"
        )
        return [
            f"Lower --balance-abs-threshold {why} (e.g. {abs_threshold:,}) and --balance-rel-threshold "
            "toward 1 (e.g. 1.2), so cache_aware sends requests to the least-loaded replica before a queue "
            "builds; the shared prefix is then cached on more than one replica.",
            "Or --policy power_of_two, which ignores prefixes and balances on token load.",
            f"Check the thresholds first: kvadmit simulate --replicas {n} --router cache_aware "
            f"--balance-abs-threshold {abs_threshold:,} --balance-rel-threshold 1.2 (same flags).",
        ]
    return [
        "Under power_of_two, poll the loads more often: a smaller --worker-startup-check-interval "
        "(sglang-router 0.3.2 polls /get_load at that interval).",
        "Under random, use power_of_two or cache_aware; when requests are alike, round_robin splits them "
        "evenly.",
        check,
    ]


def _uneven(everyone: list[ReplicaVerdict]) -> bool:
    """The busiest replica admitted over 1.25× the least busy and at least 2 requests more."""
    if not all(r.requests_seen for r in everyone):
        return False
    lo, hi = min(r.requests for r in everyone), max(r.requests for r in everyone)
    return hi > MORE_FACTOR * lo and hi - lo >= MORE_AT_LEAST


def _evidence(pressed: list[ReplicaVerdict], calm: list[ReplicaVerdict]) -> list[Quote]:
    quotes: list[Quote | None] = []
    for r in pressed:
        quotes += [r.numbers.peak_queue[1] if r.numbers.peak_queue else None, r.first_retraction]
    for r in calm:
        quotes.append(r.numbers.peak_usage[1] if r.numbers.peak_usage else None)
    return unique(quotes)[:12]


def fleet_finding(everyone: list[ReplicaVerdict]) -> Finding:
    pressed = [r for r in everyone if r.state in PRESSED]
    calm = [r for r in everyone if r.state not in PRESSED]
    n = len(everyone)
    numbers: dict[str, object] = {
        "replicas": n,
        "pressed": [r.name for r in pressed],
        "calm": [r.name for r in calm],
        "requests": {r.name: r.requests if r.requests_seen else None for r in everyone},
    }
    if pressed and calm:
        cause = cause_of(pressed, calm, everyone)
        numbers["cause"] = cause
        pressed_text = "; ".join(_describe(r) for r in pressed)
        title = f"Imbalance: {pressed_text} while {_calm_phrase(calm)} — {CAUSE_TITLE[cause]}"
        lines = [_split_line(everyone), *_cause_lines(cause, pressed, calm, n)]
        return Finding(FLEET_IMBALANCE, FLEET_IMBALANCE, 0, title, lines, _evidence(pressed, calm),
                       _advice(cause, pressed, calm, n), numbers)  # fmt: skip
    if pressed and all(r.diagnosis.verdict == IDLE_POOL for r in pressed):
        return _held_back(everyone, numbers)
    if pressed:
        failing = [r for r in pressed if r.state == FAILING]
        title = (
            f"Overloaded: every replica queues, retracts or fails ({_each(everyone)}): the fleet is short "
            "of capacity, not badly routed"
        )
        lines = [_split_line(everyone)]
        if _uneven(everyone):
            lines.append("The split is uneven: the busiest replicas queue longest; see the table.")
        if failing:
            lines.append(f"{_names(failing)} failed: see {'its' if len(failing) == 1 else 'their'} verdict.")
        advice = [
            f"Add replicas: kvadmit simulate --replicas {n + 1} (same flags) shows what one more buys; "
            "or act on each replica's verdict below.",
        ]
        return Finding(FLEET_OVERLOADED, FLEET_OVERLOADED, 0, title, lines, _evidence(pressed, []), advice,
                       numbers)  # fmt: skip
    if all(r.state == SILENT for r in everyone):
        return Finding(FLEET_OTHER, FLEET_OTHER, 0, "Not enough to judge: no replica printed a batch line",
                       [], [], [], numbers)  # fmt: skip
    title = f"Healthy: no replica queues or retracts ({_each(everyone)})"
    lines = [_split_line(everyone)]
    if _uneven(everyone):
        lines.append(
            "The split is uneven: harmless at this load, but the busiest replica will queue first as the "
            "load grows."
        )
    return Finding(FLEET_HEALTHY, FLEET_HEALTHY, RANK_NOTE, title, lines, [], [], numbers)


def _held_back(everyone: list[ReplicaVerdict], numbers: dict[str, object]) -> Finding:
    """Every replica queues with an idle pool: the replicas' setting, not their number, is the limit."""
    n = len(everyone)
    top = _top_usage(everyone)
    usage = f"token usage at most {top:.2f}; " if top is not None else ""
    title = (
        f"Held back, not short of capacity: every replica queues with its KV pool mostly unused ({usage}"
        f"{_each(everyone)}): a setting of each replica holds the requests back"
    )
    lines = [
        _split_line(everyone),
        "Each replica's own verdict is idle-pool-with-queue (below): requests wait while its pool has "
        "room. More replicas would spread the queue but repeat the limit; lifting the limit uses the "
        "memory the replicas already have.",
    ]
    firsts = {r.diagnosis.lead.advice[0] for r in everyone if r.diagnosis.lead.advice}
    shared = [f"Every replica's verdict says: {firsts.pop()}"] if len(firsts) == 1 else []
    advice = [
        *(shared or ["Act on each replica's verdict below first."]),
        f"kvadmit doctor on one replica's log alone simulates that advice from its reconstruction (the "
        f"what-if table); kvadmit simulate --replicas {n} with the setting changed (same flags) shows the "
        "fleet's, before adding replicas.",
    ]
    return Finding(FLEET_HELD_BACK, FLEET_HELD_BACK, 0, title, lines, _evidence(everyone, []), advice,
                   numbers)  # fmt: skip

"""The doctor proves its advice (issue 21): reconstruct the server and its workload from the log, check
that simulating the reconstruction reproduces the log (the replay check), and only then simulate each
piece of advice and each flag change the user names, ranked by effect."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from kvadmit.doctor import model
from kvadmit.doctor.observed import Observed
from kvadmit.doctor.reconstruct import Reconstruction, lengths
from kvadmit.doctor.resimulate import SimRun, diagnose_lines

RETRACTION_FACTOR = 2.0  # the replay must give retractions per minute within this factor of the log's
USAGE_TOLERANCE = 0.15  # and token usage within this, on average over the window
BINS = 10
RETRACTION_VERDICTS = (model.STORM, model.OCCASIONAL, model.COLLAPSE)
REALISTIC_BELOW = 0.9  # advise a realistic max_new_tokens when the outputs' p99 is under 90% of the ask


@dataclass(slots=True)
class Stats:
    """What a window of log lines shows (the real log's or a simulation's, read the same way)."""

    retractions_per_min: float
    usage_mean: float | None
    queue_mean: float | None
    throughput_mean: float | None  # gen throughput (token/s) of the Decode lines
    usage_bins: list[float | None]
    queue_bins: list[float | None]
    points: list[tuple[float, float | None, int | None]]  # (seconds into the window, usage, queue)
    retracted: float = 0  # requests retracted in the window (the mean over draws: mean_outcome)


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def window_stats(obs: Observed, t0: float, span_s: float) -> Stats:
    t1 = t0 + span_s
    decodes = [d for d in obs.decodes if t0 <= d.t <= t1]
    batch = [(e.t, e.usage, e.queue) for e in (*obs.decodes, *obs.prefills) if t0 <= e.t <= t1]
    batch.sort(key=lambda p: p[0])
    retracted = sum(r.count for r in obs.retracts if t0 <= r.t <= t1)

    def binned(values: list[tuple[float, float | None]]) -> list[float | None]:
        out: list[float | None] = []
        for b in range(BINS):
            lo, hi = t0 + span_s * b / BINS, t0 + span_s * (b + 1) / BINS
            out.append(_mean([v for t, v in values if v is not None and lo <= t < hi]))
        return out

    return Stats(
        60.0 * retracted / span_s if span_s > 0 else 0.0,
        _mean([u for _, u, _ in batch if u is not None]),
        _mean([float(q) for _, _, q in batch if q is not None]),
        _mean([d.gen_throughput for d in decodes if d.gen_throughput is not None]),
        binned([(t, u) for t, u, _ in batch]),
        binned([(t, float(q) if q is not None else None) for t, _, q in batch]),
        [(t - t0, u, q) for t, u, q in batch],
        retracted,
    )


@dataclass(slots=True)
class Scenario:
    label: str  # "--schedule-conservativeness 1.3"
    source: str  # "advice" | "user" | "today"
    overrides: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int | None = None  # what every request asks for instead (None: as reconstructed)


@dataclass(slots=True)
class Outcome:
    scenario: Scenario
    verdict: str
    stats: Stats
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_ms: float | None
    finished: int
    draws: int = 1  # runs averaged (mean_outcome)

    def row(self) -> dict[str, Any]:
        s = self.stats
        return {
            "what_if": self.scenario.label, "source": self.scenario.source, "verdict": self.verdict,
            "retractions_per_min": round(s.retractions_per_min, 2),
            "ttft_p50_ms": _r(self.ttft_p50_ms), "ttft_p99_ms": _r(self.ttft_p99_ms),
            "tpot_ms": _r(self.tpot_ms), "throughput_tok_s": _r(s.throughput_mean),
            "kv_usage": _r(s.usage_mean, 3), "queue_mean": _r(s.queue_mean, 1),
        }  # fmt: skip


def _r(x: float | None, digits: int = 1) -> float | None:
    return round(x, digits) if x is not None else None


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def outcome(rec: Reconstruction, scenario: Scenario, sim: SimRun, judge: bool = True) -> Outcome:
    """The scenario's figures from its run; its verdict too unless `judge` is false (a draw averaged
    into another's, which gives the verdict: mean_outcome)."""
    done = [o for o in sim.outcomes if o.success]
    ttfts = [1000 * o.ttft for o in done]
    tpots = [1000 * (o.latency - o.ttft) / (o.output_len - 1) for o in done if o.output_len > 1]
    stats = window_stats(sim.observed, rec.window[0], rec.span_s)
    verdict = diagnose_lines(sim.window_lines) if judge else ""
    return Outcome(
        scenario, verdict, stats, _quantile(ttfts, 0.5), _quantile(ttfts, 0.99), _mean(tpots), len(done)
    )


def _mean_or_none(xs: list[float | None]) -> float | None:
    return _mean([x for x in xs if x is not None])


def mean_outcome(draws: list[Outcome]) -> Outcome:
    """One scenario simulated over several draws of what the log does not show (resimulate.py's `draw`),
    as one: every figure the table and the replay check read is the draws' mean; the verdict and the
    timeline drawn over the log's are the first draw's."""
    first = draws[0]
    stats = [o.stats for o in draws]
    bins = len(first.stats.usage_bins)
    mean = Stats(
        statistics.fmean(s.retractions_per_min for s in stats),
        _mean_or_none([s.usage_mean for s in stats]),
        _mean_or_none([s.queue_mean for s in stats]),
        _mean_or_none([s.throughput_mean for s in stats]),
        [_mean_or_none([s.usage_bins[b] for s in stats]) for b in range(bins)],
        [_mean_or_none([s.queue_bins[b] for s in stats]) for b in range(bins)],
        first.stats.points,
        statistics.fmean(s.retracted for s in stats),
    )
    return Outcome(
        first.scenario, first.verdict, mean, _mean_or_none([o.ttft_p50_ms for o in draws]),
        _mean_or_none([o.ttft_p99_ms for o in draws]), _mean_or_none([o.tpot_ms for o in draws]),
        round(statistics.fmean(o.finished for o in draws)), sum(o.draws for o in draws),
    )  # fmt: skip


def realistic_budget(rec: Reconstruction) -> Scenario | None:
    """The advice "set realistic max_new_tokens": every request asks for the outputs' p99 (lengths.py)
    instead of the budget it asked for, when requests stop well short of it."""
    if not rec.stops_early.value:
        return None
    p99 = lengths(rec).p99()
    if p99 > REALISTIC_BELOW * rec.max_new_tokens.value:  # the outputs' p99 is about what they ask for
        return None
    return Scenario(f"max_new_tokens {p99:,} (the outputs' p99)", "advice", max_new_tokens=p99)


def advised(rec: Reconstruction, verdict: str, cause: str | None = None) -> list[Scenario]:
    """The doctor's advice, as flag changes (advice.py: raise conservativeness to 1.3, lower the request
    cap below the running count at the first retraction, ask for realistic max_new_tokens; with an idle
    pool held back by the --max-running-requests cap (`cause`, pool_rules.py), double the cap)."""
    realistic = realistic_budget(rec)
    if verdict not in RETRACTION_VERDICTS:
        if verdict != model.IDLE_POOL:
            return []
        out = []
        cap = rec.max_running_requests.value
        if cause == model.CAP_CAUSE and isinstance(cap, int) and cap > 0:
            label = f"--max-running-requests {2 * cap} (twice the cap)"
            out.append(Scenario(label, "advice", {"max_running_requests": 2 * cap}))
        return out + ([realistic] if realistic else [])
    out = [Scenario("--schedule-conservativeness 1.3", "advice", {"schedule_conservativeness": 1.3})]
    if rec.running_at_first_retraction and rec.running_at_first_retraction > 2:
        cap = int(rec.running_at_first_retraction * 0.85)  # 15% below it
        out.append(Scenario(f"--max-running-requests {cap}", "advice", {"max_running_requests": cap}))
    return out + ([realistic] if realistic else [])

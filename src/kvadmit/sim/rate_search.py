"""The largest request rate that meets a TTFT / TPOT target, by simulation.

A rate meets the target when every request succeeds and the chosen statistic (p50, p90, p95, p99 or
mean) of TTFT and of TPOT is at or below its limit. Starting from a first guess, the rate doubles while
it meets the target and halves while it does not, until a bracket [meets, fails] is found; the bracket
is then halved geometrically until its ends are within `rel_tol` of each other. The answer is the
highest rate seen to meet the target (so the search never reports a rate it did not simulate).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvadmit.sim.run import SimConfig, SimResult, simulate

Run = Callable[[SimConfig], SimResult]

STATISTICS = {"p50": "median", "median": "median", "p90": "p90", "p95": "p95", "p99": "p99", "mean": "mean"}


@dataclass(frozen=True, slots=True)
class Target:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    statistic: str = "p99"  # one of STATISTICS

    def describe(self) -> str:
        parts = []
        if self.ttft_ms is not None:
            parts.append(f"TTFT {self.statistic} ≤ {self.ttft_ms:g} ms")
        if self.tpot_ms is not None:
            parts.append(f"TPOT {self.statistic} ≤ {self.tpot_ms:g} ms")
        return " and ".join(parts) or "every request succeeds"


@dataclass(frozen=True, slots=True)
class Probe:
    rate: float
    meets: bool
    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True, slots=True)
class RateSearch:
    best_rate: float | None  # None: not even the lowest rate tried meets the target
    probes: tuple[Probe, ...] = field(default=())


def judge(result: SimResult, target: Target) -> tuple[bool, float, float]:
    """(whether the run meets the target, its TTFT and TPOT statistic in ms)."""
    m = result.metrics
    key = STATISTICS[target.statistic]
    ttft, tpot = m.ttft_ms[key], m.tpot_ms[key]
    ok = m.completed == len(result.outcomes)
    if target.ttft_ms is not None:
        ok = ok and ttft <= target.ttft_ms
    if target.tpot_ms is not None:
        ok = ok and tpot <= target.tpot_ms
    return ok, ttft, tpot


def probe(cfg: SimConfig, rate: float, target: Target, run: Run = simulate) -> Probe:
    ok, ttft, tpot = judge(run(replace(cfg, request_rate=rate)), target)
    return Probe(rate, ok, ttft, tpot)


def search_max_rate(
    cfg: SimConfig,
    target: Target,
    first_guess: float = 1.0,
    rel_tol: float = 0.02,
    lowest: float = 1e-3,
    highest: float = 1e6,
    run: Run = simulate,
) -> RateSearch:
    """`run` simulates one probe (default: one server; a fleet's FleetSpec.simulate for a fleet)."""
    probes: list[Probe] = []

    def test(rate: float) -> bool:
        p = probe(cfg, rate, target, run)
        probes.append(p)
        return p.meets

    rate = first_guess
    good: float | None = None
    bad: float | None = None
    if test(rate):
        good = rate
        while bad is None and rate < highest:
            rate *= 2
            if test(rate):
                good = rate
            else:
                bad = rate
    else:
        bad = rate
        while good is None and rate > lowest:
            rate /= 2
            if test(rate):
                good = rate
            else:
                bad = rate
    if good is not None and bad is not None:
        while bad / good - 1 > rel_tol:
            mid = (good * bad) ** 0.5
            if test(mid):
                good = mid
            else:
                bad = mid
    return RateSearch(good, tuple(probes))

"""smg 1.13.0's power_of_two, as measured against its release wheel (docs/simulate.md, "smg 1.13's
power_of_two"): two distinct workers drawn as sglang-router draws them, the one with the lower score wins.

`--power-of-two-load-metric expected_wait` (smg's default) scores worker k by its expected wait, in seconds:

    (queued + running × p + since_poll + unaccounted × p) / throughput + λ × u / (1 − u)

* queued: the polled snapshot's `num_waiting_uncached_tokens`, or `num_waiting_reqs` × p when that is 0;
* running: the snapshot's `num_running_reqs` (each counted as p tokens, whatever it holds);
* since_poll: p for every request the router sent k since that poll (reset at each poll);
* unaccounted: requests the router has in flight to k beyond those sent since the poll and those the
  snapshot shows (running + waiting), never below 0;
* throughput: the snapshot's `gen_throughput`, or `--least-load-default-throughput` (2000) when it is 0;
* u: the snapshot's `token_usage`, clamped to [0, 0.999]; λ = `--least-load-kv-pressure-weight` (0.15 s);
* p = `--least-load-mean-prefill-tokens` (1024): smg's HTTP path does not know a request's tokens.

Before the first poll no worker has a snapshot and smg joins the shorter queue: the router's in-flight
counts. `requests` compares the router's in-flight counts first and the expected wait on a tie;
`least_requests` does the same over every worker rather than a drawn pair. Exact ties are settled by
smg's reservoir draw: the k-th of equal scores met, in worker order (the pair: first drawn, second),
replaces the one held with probability 1/k. The snapshot is what a kvadmit worker answers on /v1/loads
(observe/load_snapshot.py), read at the poll."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvadmit.fleet.policies import Draw, RouterView, draw_pair

SMG_LOAD_METRICS = ("expected_wait", "requests", "least_requests")


@dataclass(frozen=True, slots=True)
class LeastLoadTunables:
    """smg's least-load scorer settings, with its flag names' defaults."""

    kv_pressure_weight: float = 0.15  # --least-load-kv-pressure-weight (seconds)
    default_throughput: float = 2000.0  # --least-load-default-throughput (tokens/s)
    mean_prefill_tokens: int = 1024  # --least-load-mean-prefill-tokens

    def check(self) -> None:
        if not self.kv_pressure_weight >= 0.0:
            raise ValueError(f"--least-load-kv-pressure-weight must be ≥ 0, got {self.kv_pressure_weight:g}")
        if not self.default_throughput > 0.0:
            raise ValueError(f"--least-load-default-throughput must be > 0, got {self.default_throughput:g}")
        if self.mean_prefill_tokens < 1:
            raise ValueError(f"--least-load-mean-prefill-tokens must be ≥ 1, got {self.mean_prefill_tokens}")


@dataclass(frozen=True, slots=True)
class PolledLoad:
    """The fields of one worker's /v1/loads snapshot that smg's score reads."""

    waiting_uncached_tokens: int
    waiting_reqs: int
    running_reqs: int
    gen_throughput: float
    token_usage: float

    @classmethod
    def from_snapshot(cls, snap: Mapping[str, Any]) -> PolledLoad:
        return cls(int(snap["num_waiting_uncached_tokens"]), int(snap["num_waiting_reqs"]),
                   int(snap["num_running_reqs"]), float(snap["gen_throughput"]),
                   float(snap["token_usage"]))  # fmt: skip


def expected_wait(load: PolledLoad, since_tokens: int, since_requests: int, in_flight: int,
                  t: LeastLoadTunables) -> float:  # fmt: skip
    """smg 1.13.0's expected-wait score of one worker (seconds; lower is better)."""
    p = t.mean_prefill_tokens
    queued = load.waiting_uncached_tokens if load.waiting_uncached_tokens > 0 else load.waiting_reqs * p
    shown = load.running_reqs + load.waiting_reqs
    unaccounted = max(0, in_flight - since_requests - shown)
    work = queued + load.running_reqs * p + since_tokens + unaccounted * p
    throughput = load.gen_throughput if load.gen_throughput > 0 else t.default_throughput
    u = min(max(load.token_usage, 0.0), 0.999)
    return work / throughput + t.kv_pressure_weight * u / (1.0 - u)


@dataclass(slots=True)
class SmgPowerOfTwo:
    rng: Draw
    metric: str = "expected_wait"
    tunables: LeastLoadTunables = field(default_factory=LeastLoadTunables)
    polled: list[PolledLoad] | None = None  # the last poll's snapshots (None before the first)
    since_tokens: list[int] = field(default_factory=list)
    since_requests: list[int] = field(default_factory=list)
    name: str = "power_of_two"
    counts_in_flight: bool = True  # smg counts every worker's requests in flight
    needs_text: bool = False
    polls_load: bool = True
    reads_snapshot: bool = True

    def __post_init__(self) -> None:
        if self.metric not in SMG_LOAD_METRICS:
            raise ValueError(f"--power-of-two-load-metric must be one of {', '.join(SMG_LOAD_METRICS)}")

    def update_loads(self, snapshots: Sequence[Mapping[str, Any]]) -> None:
        """A poll: the snapshots replace the last ones and the since-poll credits start again at 0."""
        self.polled = [PolledLoad.from_snapshot(s) for s in snapshots]
        self.since_tokens = [0] * len(snapshots)
        self.since_requests = [0] * len(snapshots)

    def score(self, view: RouterView, k: int) -> tuple[float, ...]:
        flying = view.in_flight[k]
        if self.polled is None:
            return (float(flying),)  # no snapshot anywhere yet: the shorter queue
        since_tokens, since_requests = self.since_tokens[k], self.since_requests[k]
        wait = expected_wait(self.polled[k], since_tokens, since_requests, flying, self.tunables)
        return (wait,) if self.metric == "expected_wait" else (float(flying), wait)

    def choose(self, view: RouterView, text: str | None) -> int:
        n = len(view.in_flight)
        if n == 1:
            return 0
        candidates = list(range(n)) if self.metric == "least_requests" else list(draw_pair(self.rng, n))
        k, best, tied = candidates[0], self.score(view, candidates[0]), 1
        for c in candidates[1:]:
            s = self.score(view, c)
            if s < best:
                k, best, tied = c, s, 1
            elif s == best:
                tied += 1
                if self.rng.randrange(tied) == 0:
                    k = c
        if self.polled is not None:
            self.since_tokens[k] += self.tunables.mean_prefill_tokens
            self.since_requests[k] += 1
        return k

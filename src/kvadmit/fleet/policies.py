"""The router's policies as sglang-router 0.3.2 implements them (`src/policies/*.rs` at its release), in
their own words here; SGLang's in-process data-parallel controller's `round_robin` is the same rule.

Every policy picks one of n workers for a request, given the router's view (`RouterView`): how many
requests it has in flight to each worker (the router counts them only under cache_aware: 0.3.2 holds a
load guard for cache_aware and manual alone) and the token loads it last polled from the workers' /get_load
(power_of_two; each worker's pool tokens in use plus its waiting requests' tokens).

* round_robin: worker (count mod n), the count starting at 0 and counting every request.
* random: a uniform draw.
* power_of_two: two distinct workers, i = draw(n), j = (i + 1 + draw(n − 1)) mod n; the one with the lower
  load wins, i on a tie. The loads are the polled token loads when both are known, else the router's own
  in-flight counts for both. One worker: that one, no draw.
* cache_aware: if the router's in-flight counts are imbalanced — max − min > balance_abs_threshold AND
  max > min × balance_rel_threshold (in 32-bit floats) — the least-loaded worker (the first of equals).
  Otherwise the request's text is matched against the approximate tree (radix.py): if matched / length >
  cache_threshold (32-bit floats; exactly at the threshold is not above it) the worker holding the match,
  else the least-loaded one. Either way the text is then inserted into the tree under the chosen worker.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvadmit.fleet.radix import ApproxTree

POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")


def f32(x: float) -> float:
    """x rounded to a 32-bit float, as Rust's f32 holds it."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


class Draw(Protocol):
    def randrange(self, n: int) -> int: ...


@dataclass(slots=True)
class RouterView:
    """What the router knows about its workers when it routes a request."""

    in_flight: list[int]  # requests sent and not yet answered, as the router counts them
    polled: list[int] | None = None  # token loads from the last poll (None before the first)


class Policy(Protocol):
    name: str
    counts_in_flight: bool  # whether the router keeps in-flight counts under this policy
    needs_text: bool
    polls_load: bool

    def choose(self, view: RouterView, text: str | None) -> int: ...


def draw_pair(rng: Draw, n: int) -> tuple[int, int]:
    """Two distinct workers of n ≥ 2, as power_of_two draws them: i, then j = (i + 1 + draw(n − 1)) mod n."""
    i = rng.randrange(n)
    return i, (i + 1 + rng.randrange(n - 1)) % n


def first_least(loads: Sequence[int]) -> int:
    """The index of the smallest value, the first of equals (Rust's min_by_key)."""
    best = 0
    for i in range(1, len(loads)):
        if loads[i] < loads[best]:
            best = i
    return best


@dataclass(slots=True)
class RoundRobin:
    name: str = "round_robin"
    counts_in_flight: bool = False
    needs_text: bool = False
    polls_load: bool = False
    count: int = 0

    def choose(self, view: RouterView, text: str | None) -> int:
        k = self.count % len(view.in_flight)
        self.count += 1
        return k


@dataclass(slots=True)
class Random:
    rng: Draw
    name: str = "random"
    counts_in_flight: bool = False
    needs_text: bool = False
    polls_load: bool = False

    def choose(self, view: RouterView, text: str | None) -> int:
        return self.rng.randrange(len(view.in_flight))


@dataclass(slots=True)
class PowerOfTwo:
    rng: Draw
    name: str = "power_of_two"
    counts_in_flight: bool = False
    needs_text: bool = False
    polls_load: bool = True

    def choose(self, view: RouterView, text: str | None) -> int:
        n = len(view.in_flight)
        if n == 1:
            return 0
        i, j = draw_pair(self.rng, n)
        loads = view.polled if view.polled is not None else view.in_flight
        return i if loads[i] <= loads[j] else j


@dataclass(slots=True)
class CacheAware:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    tree: ApproxTree = field(default_factory=ApproxTree)
    name: str = "cache_aware"
    counts_in_flight: bool = True
    needs_text: bool = True
    polls_load: bool = False

    def start(self, workers: int) -> None:
        """The router registers each worker with an empty text (one epoch each)."""
        for k in range(workers):
            self.tree.insert("", k)

    def imbalanced(self, loads: Sequence[int]) -> bool:
        lo, hi = min(loads), max(loads)
        rel = f32(f32(lo) * f32(self.balance_rel_threshold))  # Rust: max as f32 > min as f32 * rel (f32)
        return hi - lo > self.balance_abs_threshold and f32(hi) > rel

    def choose(self, view: RouterView, text: str | None) -> int:
        loads = view.in_flight
        text = text or ""
        if self.imbalanced(loads):
            k = first_least(loads)
        else:
            tenant, matched = self.tree.prefix_match(text)
            rate = f32(matched / len(text)) if text else 0.0
            k = tenant if rate > f32(self.cache_threshold) and tenant is not None else first_least(loads)
        self.tree.insert(text, k)
        return k


def make_policy(
    name: str,
    workers: int,
    seed: int = 0,
    cache_threshold: float = 0.3,
    balance_abs_threshold: int = 64,
    balance_rel_threshold: float = 1.5,
) -> Policy:
    if name == "round_robin":
        return RoundRobin()
    if name == "random":
        return Random(random.Random(seed))
    if name == "power_of_two":
        return PowerOfTwo(random.Random(seed))
    if name == "cache_aware":
        policy = CacheAware(cache_threshold, balance_abs_threshold, balance_rel_threshold)
        policy.start(workers)
        return policy
    raise ValueError(f"unknown router policy {name!r}; choose from {', '.join(POLICIES)}")

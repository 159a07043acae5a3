"""Rates of rare events, and how sure a count makes us of them.

SGLang's tuning guide tolerates a retraction "occasionally (~1 time per minute)". A log excerpt cut
around one retraction shows a high rate by construction, so a storm must be more than a high point
estimate: the rate must exceed the tolerance even at the low end of what the count allows (the 90%
one-sided Poisson lower bound), and there must be at least three events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TOLERATED_PER_MINUTE = 1.0
MIN_STORM_EVENTS = 3
BURST_PER_MINUTE = 5  # this many in any one minute is a burst, whatever the long-run rate
_CONFIDENCE = 0.9


def poisson_lower(k: int, confidence: float = _CONFIDENCE) -> float:
    """The smallest mean λ for which seeing ≥ k events has probability 1 − confidence."""
    if k <= 0:
        return 0.0
    if k > 400:  # normal approximation, plenty at this size
        return max(k - 1.2816 * math.sqrt(k), 0.0)

    def tail(lam: float) -> float:  # P(X ≥ k | λ)
        term = math.exp(-lam)
        cdf = term
        for i in range(1, k):
            term *= lam / i
            cdf += term
        return 1.0 - cdf

    lo, hi = 0.0, float(k)
    for _ in range(60):
        mid = (lo + hi) / 2
        if tail(mid) < 1.0 - confidence:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True, slots=True)
class Rate:
    events: int
    seconds: float | None

    @property
    def per_minute(self) -> float | None:
        if not self.seconds or self.seconds <= 0:
            return None
        return self.events / self.seconds * 60

    @property
    def per_minute_low(self) -> float | None:
        if not self.seconds or self.seconds <= 0:
            return None
        return poisson_lower(self.events) / self.seconds * 60

    def is_storm(self, peak_per_minute: int = 0) -> bool:
        if peak_per_minute >= BURST_PER_MINUTE:
            return True
        low = self.per_minute_low
        return self.events >= MIN_STORM_EVENTS and low is not None and low > TOLERATED_PER_MINUTE


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def per_minute(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def n(x: float) -> str:
    """A count for a sentence: thousands separators, no decimals."""
    return f"{round(x):,}"


_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
)
_ORDINALS = (
    "zeroth",
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
    "eleventh",
    "twelfth",
    "thirteenth",
)


def word(k: int) -> str:
    return _WORDS[k] if 0 <= k < len(_WORDS) else f"{k:,}"


def ordinal(k: int) -> str:
    if 0 <= k < len(_ORDINALS):
        return _ORDINALS[k]
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k:,}{suffix}"

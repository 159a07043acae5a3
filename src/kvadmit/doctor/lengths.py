"""The output-length distribution a reconstruction simulates: its mean, its spread and the budget
(max_new_tokens) that caps it.

The spread comes from the inspection paradox. A request seen running is caught at a random moment of its
life, so longer requests are seen more often: over a steady stretch the mean output a running request
already holds (its age) is E[X²] ÷ (2 E[X]) = E[X] (1 + CV²) ÷ 2, where X is a request's output length
and CV its coefficient of variation. The Decode lines give the age (#token ÷ #running-req less the
prompt), the finished requests E[X]: CV² = 2 × age ÷ E[X] − 1 (0 when every request is as long: its
mean age is half its length; ⅓ for lengths uniform on [0, 2 E[X]]).

The shape simulated: up to CV² = ⅓, lengths uniform on [E[X] (1 − s), E[X] (1 + s)] with s = √(3 CV²);
beyond it, the quantiles of that widest uniform and of an exponential mixed (the exponential alone at
CV² = 1). Capped at the budget, with the mean kept (the lengths before the cap scaled up to make up
for it)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

UNIFORM_MAX_CV2 = 1.0 / 3.0  # lengths uniform on [0, 2 × mean]: the widest uniform spread
CDF_GRID = 400  # quantiles that tabulate the share of lengths below a count (beyond)
BLOCK = 256  # requests whose lengths together hold the whole distribution (spread)


@dataclass(frozen=True, slots=True)
class OutputLengths:
    mean: float
    cv2: float  # the squared coefficient of variation
    budget: int  # max_new_tokens: no length exceeds it

    @property
    def half_width(self) -> float:
        """s: lengths uniform on mean × [1 − s, 1 + s] (1 beyond ⅓)."""
        return math.sqrt(3.0 * min(max(self.cv2, 0.0), UNIFORM_MAX_CV2))

    def _shape(self, u: float) -> float:
        """The length at quantile u, for a mean of 1, before the cap."""
        u = min(max(u, 0.0), 1.0 - 1e-9)
        s = self.half_width
        uniform = 1.0 - s + 2.0 * s * u
        if self.cv2 <= UNIFORM_MAX_CV2:
            return uniform
        # Between the widest uniform and the exponential, their quantiles mixed (both have mean 1).
        w = min((self.cv2 - UNIFORM_MAX_CV2) / (1.0 - UNIFORM_MAX_CV2), 1.0)
        return (1.0 - w) * uniform - w * math.log(1.0 - u)

    def _scale(self) -> float:
        """The mean before the cap that keeps the mean after it (a few fixed-point steps)."""
        grid = [self._shape((k + 0.5) / 200) for k in range(200)]
        scale = self.mean
        for _ in range(8):
            capped = sum(min(max(1.0, scale * g), self.budget) for g in grid) / len(grid)
            if capped <= 0 or abs(capped - self.mean) < 0.5:
                break
            scale *= self.mean / capped
        return scale

    def quantile(self, u: float, scale: float | None = None) -> int:
        x = (scale if scale is not None else self._scale()) * self._shape(u)
        return min(max(1, round(x)), self.budget)

    def spread(self, n: int, seed: int) -> list[int]:
        """n lengths, in the order requests get them: each block of BLOCK consecutive requests holds the
        distribution's quantiles evenly spaced, shuffled within the block. Within a block the order is as
        random as independent draws (a long request may follow a long one: runs of them are what fill a
        pool past its reservations and retract), while every block's mean is the mean (within the cap).
        A shuffle of all n would let the running mean drift by chance (CV ÷ √k after k requests), and a
        queue's waits follow it: a seed's drift became the what-if's TTFT error (docs/doctor.md)."""
        scale = self._scale()
        rng = np.random.RandomState(seed)
        lens: list[int] = []
        for first in range(0, n, BLOCK):
            m = min(BLOCK, n - first)
            block = [self.quantile((k + 0.5) / m, scale) for k in range(m)]
            rng.shuffle(block)
            lens += block
        return lens

    def beyond(self, done: list[int], seed: int) -> list[int]:
        """The whole length of requests that have generated `done` tokens and are still running: drawn
        from the lengths longer than that, the k-th at quantile F(d) + u (1 − F(d)) with u evenly spaced
        over the requests and shuffled (F(d) the share of lengths at most d). So a request caught early
        is as likely short as any, and one caught late runs on as the distribution's tail says."""
        scale = self._scale()
        grid = [self.quantile((k + 0.5) / CDF_GRID, scale) for k in range(CDF_GRID)]
        us = [(k + 0.5) / max(len(done), 1) for k in range(len(done))]
        np.random.RandomState(seed).shuffle(us)
        out = []
        for d, u in zip(done, us, strict=True):
            below = bisect.bisect_right(grid, d) / CDF_GRID
            out.append(max(self.quantile(below + u * (1.0 - below), scale), d + 1))
        return out

    def p99(self) -> int:
        return self.quantile(0.99)

    def longest(self) -> int:
        """The length at quantile 0.995: the longest a budget must allow."""
        return self.quantile(0.995)

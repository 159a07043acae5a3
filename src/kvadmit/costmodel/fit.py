"""Least-squares fits of step times for cost models (calibration from logs, profiling), numpy only.

`fit_step_time` fits y ≈ Σ coef_j × x_j with every coefficient ≥ 0 (a cost model cannot have a negative
cost), minimising *relative* error (each row weighted by 1/y), since what a user compares is throughput.
Non-negativity is kept by trying every subset of the columns and keeping the best one whose solution is
all ≥ 0, penalising extra columns (SSE × (n + p) / (n − p)) so that three noisy points do not buy a
three-term model. Rows whose relative error is far outside the rest (beyond max(10%, 3 robust standard
deviations)) are dropped once and the fit is redone: a log window that held an unlogged prefill is slow
for a reason the model does not know.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class StepFit:
    coef: dict[str, float]  # every column, 0.0 for those not used
    terms: tuple[str, ...]  # the columns used
    rel_errors: tuple[float, ...]  # (predicted − y) / y for every row, outliers included
    outliers: tuple[int, ...] = field(default=())  # rows left out of the final fit

    def predict(self, row: dict[str, float]) -> float:
        return sum(c * (1.0 if name == "one" else row.get(name, 0.0)) for name, c in self.coef.items())

    @property
    def mean_abs_error(self) -> float:
        kept = [abs(e) for i, e in enumerate(self.rel_errors) if i not in self.outliers]
        return float(np.mean(kept)) if kept else 0.0

    @property
    def max_abs_error(self) -> float:
        kept = [abs(e) for i, e in enumerate(self.rel_errors) if i not in self.outliers]
        return max(kept, default=0.0)


class FitError(ValueError):
    """Too little data to fit; the message says what is missing."""


def _solve(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float] | None:
    """Weighted least squares on relative error; None when the columns are dependent."""
    w = 1.0 / y
    xw = x * w[:, None]
    if np.linalg.matrix_rank(xw) < x.shape[1]:
        return None
    beta, *_ = np.linalg.lstsq(xw, y * w, rcond=None)
    resid = (x @ beta - y) / y
    return beta, float(resid @ resid)


def _score(sse: float, n: int, p: int, selection: str) -> float:
    """How a subset of p columns is ranked (lower wins). "fpe": Akaike's final prediction error, SSE ×
    (n + p) ÷ (n − p); a term stays when it cuts the SSE by more than about 2 ÷ n of it. "strict": the
    same in log form, n ln FPE, plus ln n − 2 a term (what the Bayesian information criterion charges a
    term beyond Akaike's 2): a term stays only when it cuts the SSE by more than about ln(n) ÷ n of it
    (1.6% over 360 windows), so never when FPE would drop it, and not when it only fits the noise
    (calibrate.py's prefill base when every prefill is about the same size)."""
    fpe = sse * (n + p) / (n - p) if n > p else sse
    if selection == "strict":
        return n * math.log(max(fpe, 1e-300)) + p * max(math.log(n) - 2.0, 0.0)
    return fpe


def _best_subset(
    rows: np.ndarray, y: np.ndarray, columns: tuple[str, ...], selection: str = "fpe"
) -> tuple[tuple[int, ...], np.ndarray]:
    n = len(y)
    best: tuple[float, tuple[int, ...], np.ndarray] | None = None
    for p in range(1, len(columns) + 1):
        for subset in itertools.combinations(range(len(columns)), p):
            if n <= p and p > 1:
                continue
            solved = _solve(rows[:, subset], y)
            if solved is None or (solved[0] < 0).any():
                continue
            beta, sse = solved
            score = _score(sse, n, p, selection)
            if best is None or score < best[0] - (1e-15 if selection == "fpe" else 1e-9):
                best = (score, subset, beta)
    if best is None:
        raise FitError("no non-negative fit exists for these observations")
    return best[1], best[2]


def fit_step_time(
    rows: list[dict[str, float]], y: list[float], columns: tuple[str, ...], selection: str = "fpe"
) -> StepFit:
    """Fit y (seconds or ms, all > 0) on the named columns of `rows`; "one" is a column of ones if listed.
    `selection`: how the subset of columns is chosen (_score)."""
    if not rows:
        raise FitError("no observations to fit")
    x = np.array([[1.0 if c == "one" else float(r.get(c, 0.0)) for c in columns] for r in rows])
    target = np.asarray(y, dtype=float)
    if (target <= 0).any():
        raise FitError("every observed time must be > 0")
    keep = np.arange(len(target))
    subset, beta = _best_subset(x, target, columns, selection)
    errors = (x[:, subset] @ beta - target) / target
    spread = 1.4826 * float(np.median(np.abs(errors)))
    limit = max(0.10, 3.0 * spread)
    outliers = tuple(int(i) for i in np.flatnonzero(np.abs(errors) > limit))
    if outliers and len(target) - len(outliers) >= 3:
        keep = np.setdiff1d(keep, outliers)
        subset, beta = _best_subset(x[keep], target[keep], columns, selection)
        errors = (x[:, subset] @ beta - target) / target
    else:
        outliers = ()
    coef = dict.fromkeys(columns, 0.0)
    for j, b in zip(subset, beta, strict=True):
        coef[columns[j]] = float(b)
    return StepFit(coef, tuple(columns[j] for j in subset), tuple(float(e) for e in errors), outliers)

"""A cost model calibrated from an SGLang server log (`kvadmit calibrate LOG… -o cost.json`).

What the log says (docs/sglang-rules.md §4):
* A `Decode batch` line is printed every --decode-log-interval (n = 40) decode steps; its `gen throughput`
  is the tokens generated since the previous decode line over the seconds since then. Between the two
  lines ran n decode steps of about `#running-req` requests each, and every prefill batch whose line
  falls between them. So a window lasted n × B / gen_throughput seconds, and one decode step took

      step = (n × B / gen_throughput − Σ prefill times in the window) / n

  where B and #token are averaged over the window's two ends when the previous line is known.
* A `Prefill batch` line's `input throughput` is its new tokens over the seconds since the previous
  prefill line. Right after another prefill line (no decode line between) that is close to the prefill's
  own duration; after a decode line it mostly measures the time spent decoding, and is not used.

Both are fitted together (fit.py): a window's duration is n × (base_ms + per_request_ms × B +
per_kv_token_ms × #token) plus, for each prefill inside it, prefill base_ms + tokens / tokens_per_s; a
back-to-back prefill's duration is the latter alone. Every decode line is then predicted back (its
window's prefills included) to show the fit's error.
A window whose start is not in the excerpt (the first decode line, a `…` gap, a timestamp jump longer
than the window) is taken to hold no prefill, and marked so.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvadmit.costmodel.costmodel import CostModel, DecodeCost, PrefillCost
from kvadmit.costmodel.fit import FitError, StepFit, fit_step_time
from kvadmit.observe.logread import BatchLine, read_batch_lines

# Fit columns → decode base_ms, per_request_ms, per_kv_token_ms; ms per prefill token, prefill base_ms.
DECODE_COLUMNS = ("steps", "batch", "kv")
PREFILL_COLUMNS = ("prefill_tokens", "prefill_batches")
DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0


class CalibrationError(ValueError):
    """The log holds too little to calibrate from; the message says what is missing."""


@dataclass(frozen=True, slots=True)
class DecodeWindow:
    where: str  # "file:line"
    batch: float  # #running-req, averaged over the window when its start is known
    kv_tokens: float  # #token, likewise
    running_req: int  # as printed
    num_used_tokens: int
    gen_throughput: float
    prefills: tuple[tuple[int, int, int], ...]  # (new-seq, new-token, cached-token) inside the window
    window_known: bool


@dataclass(slots=True)
class Calibration:
    cost: CostModel
    windows: list[DecodeWindow]
    decode_fit: StepFit
    prefill_samples: list[tuple[int, float]]  # (new tokens, input throughput) of back-to-back lines
    decode_log_interval: int
    prefill_fit: StepFit | None = None  # when prefill came from back-to-back lines, not the windows
    notes: list[str] = field(default_factory=list)

    def prefill_seconds(self, w: DecodeWindow) -> float:
        return sum(self.cost.prefill.seconds(r, n, c) for r, n, c in w.prefills)

    def predicted_gen_throughput(self, w: DecodeWindow) -> float:
        """What the log line should print if the model were right: the window's tokens over its
        decode steps plus its prefills."""
        n = self.decode_log_interval
        step = self.cost.decode.seconds(w.batch, w.kv_tokens)
        return n * w.batch / (n * step + self.prefill_seconds(w))

    def error(self, w: DecodeWindow) -> float:
        return self.predicted_gen_throughput(w) / w.gen_throughput - 1

    def coverage(self) -> str:
        """The range the decode fit saw; outside it the model extrapolates."""
        b = [w.running_req for w in self.windows]
        k = [w.num_used_tokens for w in self.windows]
        return (
            f"seen: #running-req {min(b)}–{max(b)}, #token {min(k):,}–{max(k):,} "
            "(outside this range the model extrapolates)"
        )

    def is_outlier(self, i: int) -> bool:
        return i in self.decode_fit.outliers


def _sequences(lines: list[BatchLine]) -> list[list[BatchLine]]:
    """Lines that follow one another: the same excerpt segment and the same rank."""
    groups: dict[tuple[int, str], list[BatchLine]] = {}
    for line in lines:
        groups.setdefault((line.segment, line.stream), []).append(line)
    return list(groups.values())


def _prefill_samples(seq: list[BatchLine]) -> list[tuple[int, float]]:
    """(new tokens, input throughput) of each prefill line right after another prefill line."""
    out = []
    for prev, line in itertools.pairwise(seq):
        thr, tokens = line.number("input_throughput"), line.number("new_token")
        if prev.kind == "prefill" and line.kind == "prefill" and thr and tokens:
            out.append((int(tokens), thr))
    return out


def _decode_windows(seq: list[BatchLine], name: str, n: int) -> list[DecodeWindow]:
    out = []
    prev: BatchLine | None = None
    inside: list[tuple[int, int, int]] = []
    for line in seq:
        if line.kind == "prefill":
            inside.append(
                (int(line.number("new_seq") or 0), int(line.number("new_token") or 0),
                 int(line.number("cached_token") or 0))
            )  # fmt: skip
            continue
        b, k, thr = line.number("running_req"), line.number("num_used_tokens"), line.number("gen_throughput")
        if not b or k is None or not thr:
            prev, inside = line, []
            continue
        known = prev is not None and prev.number("running_req") is not None
        if known and prev is not None and prev.time is not None and line.time is not None:
            # Timestamps print whole seconds; a longer gap than the window means lines are missing.
            span = (line.time - prev.time).total_seconds()
            known = span <= n * b / thr + 2.0
        if known and prev is not None:
            b_mean = (b + (prev.number("running_req") or b)) / 2
            k_mean = (k + (prev.number("num_used_tokens") or k)) / 2
        else:
            b_mean, k_mean = b, k
        out.append(
            DecodeWindow(f"{name}:{line.line_no}", b_mean, k_mean, int(b), int(k), thr,
                         tuple(inside) if known else (), known)
        )  # fmt: skip
        prev, inside = line, []
    return out


def _window_rows(windows: list[DecodeWindow], n: int) -> tuple[list[dict[str, float]], list[float]]:
    """One row per decode window: its duration in ms, and what it spent it on."""
    rows, y = [], []
    for w in windows:
        rows.append({
            "steps": n, "batch": n * w.batch, "kv": n * w.kv_tokens,
            "prefill_tokens": sum(t for _, t, _ in w.prefills), "prefill_batches": len(w.prefills),
        })  # fmt: skip
        y.append(1000 * n * w.batch / w.gen_throughput)
    return rows, y


def _fit(rows: list[dict[str, float]], y: list[float], columns: tuple[str, ...], selection: str) -> StepFit:
    try:
        return fit_step_time(rows, y, columns, selection)
    except FitError as e:
        raise CalibrationError(str(e)) from None


def calibrate(
    logs: Iterable[tuple[str, list[str]]], decode_log_interval: int = 40, selection: str = "fpe"
) -> Calibration:
    """Calibrate from (name, lines) of one or more excerpts of the same server's log.

    A decode window lasts n × (base + per_request × B + per_kv × #token) plus its prefills, each
    prefill_base + tokens / tokens_per_s; one fit over the windows gives all five coefficients
    (fit.py: non-negative, relative error, outliers dropped once). The windows are the better evidence on
    prefill too: a back-to-back prefill line's time can hide unlogged decode steps. Only when no window
    holds a prefill are those lines fitted instead.
    """
    n = decode_log_interval
    windows: list[DecodeWindow] = []
    samples: list[tuple[int, float]] = []
    names: list[str] = []
    for name, lines in logs:
        names.append(name)
        for seq in _sequences(read_batch_lines(lines)):
            samples += _prefill_samples(seq)
            windows += _decode_windows(seq, name, n)
    if not windows:
        raise CalibrationError("no Decode batch line with #running-req, #token and gen throughput")
    rows, y = _window_rows(windows, n)
    notes = []
    prefill_fit: StepFit | None = None
    if any(w.prefills for w in windows):
        fit = _fit(rows, y, DECODE_COLUMNS + PREFILL_COLUMNS, selection)
        per_token_ms, prefill_base = fit.coef["prefill_tokens"], fit.coef["prefill_batches"]
    else:
        fit = _fit(rows, y, DECODE_COLUMNS, selection)
        per_token_ms = prefill_base = 0.0
        if samples:
            prefill_fit = _fit(
                [{"prefill_tokens": t, "prefill_batches": 1} for t, _ in samples],
                [1000 * t / thr for t, thr in samples],
                PREFILL_COLUMNS,
                selection,
            )
            per_token_ms = prefill_fit.coef["prefill_tokens"]
            prefill_base = prefill_fit.coef["prefill_batches"]
            notes.append("no decode window holds a prefill: prefill fitted on back-to-back prefill lines")
    if per_token_ms > 0:
        tokens_per_s = 1000 / per_token_ms
    else:
        tokens_per_s = DEFAULT_PREFILL_TOKENS_PER_S
        notes.append(f"the log does not time prefill tokens: {tokens_per_s:,.0f} tokens/s assumed")
    c = fit.coef
    decode = DecodeCost(base_ms=c["steps"], per_request_ms=c["batch"], per_kv_token_ms=c["kv"])
    prefill = PrefillCost(base_ms=prefill_base, tokens_per_s=tokens_per_s)
    cal = Calibration(CostModel(decode, prefill), windows, fit, samples, n, prefill_fit, notes)
    cal.cost = CostModel(decode, prefill, _meta(cal, names))
    return cal


def _meta(cal: Calibration, names: list[str]) -> dict[str, object]:
    errors = [abs(cal.error(w)) for w in cal.windows]
    fit = cal.decode_fit
    used = len(fit.rel_errors) - len(fit.outliers)
    prefill_errors = [abs(e) for e in cal.prefill_fit.rel_errors] if cal.prefill_fit else []
    return {
        "name": "calibrated:" + ",".join(names),
        "source": "kvadmit calibrate (SGLang Decode/Prefill batch lines)",
        "notes": [
            f"fitted on {used} of {len(cal.windows)} Decode batch windows (terms: {', '.join(fit.terms)}); "
            f"--decode-log-interval {cal.decode_log_interval}",
            cal.coverage(),
            *cal.notes,
        ],
        "fit": {
            "decode_windows": len(cal.windows),
            "prefill_lines": len(cal.prefill_samples),
            "outliers": len(fit.outliers),
            "gen_throughput_mean_abs_error_pct": round(100 * sum(errors) / len(errors), 2),
            "gen_throughput_max_abs_error_pct": round(100 * max(errors), 2),
            "prefill_lines_max_abs_error_pct": (
                round(100 * max(prefill_errors), 2) if prefill_errors else None
            ),
        },
    }


def calibrate_files(paths: list[str], decode_log_interval: int = 40) -> Calibration:
    logs = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                logs.append((path.rsplit("/", 1)[-1], f.read().splitlines()))
        except OSError as e:
            raise CalibrationError(f"cannot read {path!r}: {e.strerror}") from None
    return calibrate(logs, decode_log_interval)

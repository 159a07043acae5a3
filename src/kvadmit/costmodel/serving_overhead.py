"""The serving stack's time per step, from a log of the real server: what a step takes there beyond what
the executor alone takes for the same batch (HTTP and streaming threads, the client, on the same cores).

The server must log every step (`kvadmit serve --decode-log-interval 1`): a Decode batch line that
follows another one then covers exactly one decode step, and its gen throughput is #running-req over
that step's seconds. For each such line, the residual is the step's time there minus the cost model's
time for the same batch (#running-req requests holding #token tokens: the pool's used tokens, which
count a shared prefix once where attention reads it per request, so with shared prefixes the executor's
part is underestimated and the overhead overestimated; the probe should use distinct prompts). The fit

    overhead ms = a + b × running requests

is fitted to the median residual of each batch size, weighted by its number of steps (a step the
machine's other work slowed moves a median little, and a handful of steps at one size no more than
their weight), with a ≥ 0 and b ≥ 0 (the stack never makes a step faster: a negative intercept is
refitted through 0); a constant when the log has one batch size. `add_overhead` adds it to every decode
step, and to every prefill step as a + b × its requests (a prefill streams one token for each).

A prefill step's own excess is not in a log (a Prefill batch line has no step time), but it is in the
server's step trace (`kvadmit serve --trace-steps`): each prefill step's seconds there minus the cost
model's for the same batch. On this 2-core machine it was 1–106 ms a step in the probes of
benchmarks/sim_fidelity.py (our reading: a new request's HTTP handling runs beside its prefill), and it
did not grow steadily with the requests in the step; `measure_prefill_overhead` takes its median (≥ 0,
as above), which `add_overhead` then adds to every prefill step in place of a + b × requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvadmit.costmodel.costmodel import CostModel, DecodeTable
from kvadmit.observe.loglines import DECODE


class ServingOverheadError(ValueError):
    """The log has too few consecutive decode lines to measure the overhead from."""


@dataclass(frozen=True, slots=True)
class ServingOverhead:
    base_ms: float  # a
    per_request_ms: float  # b
    steps: int  # decode steps it was measured over
    batch_sizes: tuple[int, int]  # the smallest and largest #running-req among them
    mean_residual_ms: float

    def ms(self, requests: int) -> float:
        return max(self.base_ms + self.per_request_ms * requests, 0.0)


@dataclass(frozen=True, slots=True)
class PrefillOverhead:
    ms: float  # added to every prefill step
    steps: int  # prefill steps it was measured over


MIN_STEPS = 5


def logged_steps(lines: Iterable[str]) -> Iterator[tuple[int, int, float]]:
    """(#running-req, #token, ms) of each decode step the log times alone: a Decode batch line right
    after another one (with nothing but other lines, such as HTTP access lines, between)."""
    after_decode = False
    for line in lines:
        if "Decode batch" not in line:
            after_decode = after_decode and "Prefill batch" not in line
            continue
        fields = DECODE.parse(line)
        if fields is None:
            continue
        running, tokens, gen = fields["running_req"], fields["num_used_tokens"], fields["gen_throughput"]
        assert isinstance(running, int) and isinstance(tokens, int) and isinstance(gen, float)
        if after_decode and running > 0 and gen > 0:
            yield running, tokens, 1000 * running / gen
        after_decode = True


def measure_overhead(logs: Sequence[Iterable[str]], cost: CostModel) -> ServingOverhead:
    """The overhead over the steps of one or more logs (each read apart: a log's first decode line never
    counts as a step after another log's last)."""
    batch: list[float] = []
    residual: list[float] = []
    for lines in logs:
        for running, tokens, ms in logged_steps(lines):
            batch.append(running)
            residual.append(ms - 1000 * cost.decode.seconds(running, tokens))
    if len(residual) < MIN_STEPS:
        raise ServingOverheadError(
            f"only {len(residual)} decode steps logged right after another decode step (at least "
            f"{MIN_STEPS} needed): run the server with --decode-log-interval 1 and enough requests"
        )
    a, b = _robust_line(batch, residual)
    x, y = np.asarray(batch), np.asarray(residual)
    return ServingOverhead(a, b, len(y), (int(x.min()), int(x.max())), float(y.mean()))


def traced_prefills(
    rows: Iterable[Mapping[str, object]], source: str
) -> Iterator[tuple[int, int, int, float]]:
    """(requests, new tokens, cached tokens, ms) of each prefill step of a `--trace-steps` file's rows."""
    for n, row in enumerate(rows, 1):
        if row.get("kind") != "prefill":
            continue
        values = [row.get(k) for k in ("batch_size", "new_tokens", "cached_tokens", "seconds")]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ServingOverheadError(
                f"{source} step line {n}: a prefill step needs batch_size, new_tokens, cached_tokens and "
                f"seconds, numbers ≥ 0 (as kvadmit serve --trace-steps writes them); got {dict(row)}"
            )
        requests, new, cached, seconds = values
        yield int(requests), int(new), int(cached), 1000 * float(seconds)  # type: ignore[arg-type]


def measure_prefill_overhead(
    traces: Sequence[tuple[str, Iterable[Mapping[str, object]]]], cost: CostModel
) -> PrefillOverhead:
    """The median excess of the traces' prefill steps (each (source, rows)) over the cost model's time for
    the same batch, ≥ 0."""
    residual = [
        ms - 1000 * cost.prefill.seconds(requests, new, cached)
        for source, rows in traces
        for requests, new, cached, ms in traced_prefills(rows, source)
    ]
    if len(residual) < MIN_STEPS:
        raise ServingOverheadError(
            f"only {len(residual)} prefill steps in the step traces (at least {MIN_STEPS} needed): give "
            "kvadmit serve --trace-steps files of runs with enough requests (each prefill is a step)"
        )
    return PrefillOverhead(max(float(np.median(residual)), 0.0), len(residual))


def _robust_line(batch: list[float], residual: list[float]) -> tuple[float, float]:
    """(a, b) ≥ 0 of a + b × batch, fitted to each batch size's median residual, weighted by its count."""
    groups: dict[float, list[float]] = {}
    for x, r in zip(batch, residual, strict=True):
        groups.setdefault(x, []).append(r)
    xs = np.array(sorted(groups))
    ms = np.array([float(np.median(groups[x])) for x in xs])
    ws = np.array([len(groups[x]) for x in xs], dtype=float)
    if len(xs) >= 2:
        b, a = np.polyfit(xs, ms, 1, w=np.sqrt(ws))  # polyfit squares the weights
        if a < 0:  # through the origin instead
            a, b = 0.0, float(np.sum(ws * xs * ms) / np.sum(ws * xs * xs))
        if b < 0:
            a, b = float(np.average(ms, weights=ws)), 0.0
    else:
        a, b = float(ms[0]), 0.0
    return max(float(a), 0.0), max(float(b), 0.0)


def add_overhead(
    cost: CostModel, oh: ServingOverhead, source: str, prefill: tuple[PrefillOverhead, str] | None = None
) -> CostModel:
    """`oh` added to every decode step, and to every prefill step as a + b × its requests unless
    `prefill` gives the prefill steps' own (measure_prefill_overhead, and where it was measured)."""
    d, p = cost.decode, cost.prefill
    table = d.table
    if table is not None:
        rows = zip(table.batch_sizes, table.ms, strict=True)
        table = DecodeTable(
            table.batch_sizes, table.context_lens, tuple(tuple(v + oh.ms(b) for v in row) for b, row in rows)
        )
    decode = replace(d, base_ms=max(d.base_ms + oh.base_ms, 0.0),
                     per_request_ms=max(d.per_request_ms + oh.per_request_ms, 0.0), table=table)  # fmt: skip
    if prefill is None:
        prefill_cost = replace(p, base_ms=max(p.base_ms + oh.base_ms, 0.0),
                               per_request_ms=max(p.per_request_ms + oh.per_request_ms, 0.0))  # fmt: skip
    else:
        prefill_cost = replace(p, base_ms=p.base_ms + prefill[0].ms)
    meta = dict(cost.meta)
    meta["notes"] = [
        *meta.get("notes", []),
        f"+ {oh.base_ms:.2f} + {oh.per_request_ms:.3f} × requests ms per step: the serving stack beyond the "
        f"executor, from {oh.steps} decode steps ({oh.batch_sizes[0]}–{oh.batch_sizes[1]} running) of "
        f"{source}",
    ]
    meta["fit"] = {**meta.get("fit", {}), "serving_overhead_base_ms": round(oh.base_ms, 3),
                   "serving_overhead_per_request_ms": round(oh.per_request_ms, 4)}  # fmt: skip
    if prefill is not None:
        meta["notes"].append(
            f"+ {prefill[0].ms:.2f} ms per prefill step (in place of the line above's a + b × requests "
            f"there): the serving stack beyond the executor, the median of {prefill[0].steps} prefill "
            f"steps of {prefill[1]}"
        )
        meta["fit"]["serving_prefill_overhead_ms"] = round(prefill[0].ms, 3)
    return CostModel(decode, prefill_cost, meta)

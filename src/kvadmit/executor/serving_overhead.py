"""The serving stack's time per step, from a log of the real server: what a step takes there beyond what
the executor alone takes for the same batch (HTTP and streaming threads, the client, on the same cores).

The server must log every step (`kvadmit serve --decode-log-interval 1`): a Decode batch line that
follows another one then covers exactly one decode step, and its gen throughput is #running-req over
that step's seconds. For each such line, the residual is the step's time there minus the cost model's
time for the same batch (#running-req requests holding #token tokens: the pool's used tokens, which
count a shared prefix once where attention reads it per request, so with shared prefixes the executor's
part is underestimated and the overhead overestimated; the probe should use distinct prompts). The fit

    overhead ms = a + b × running requests

(least squares; a constant when the log has fewer than two batch sizes) is what `add_overhead` adds to
every decode step, and to every prefill step as a + b × its requests (a prefill streams one token for
each of them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from kvadmit.executor.costmodel import CostModel, DecodeTable
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


MIN_STEPS = 5


def measure_overhead(lines: Iterable[str], cost: CostModel) -> ServingOverhead:
    batch: list[float] = []
    residual: list[float] = []
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
            batch.append(running)
            residual.append(1000 * running / gen - 1000 * cost.decode.seconds(running, tokens))
        after_decode = True
    if len(residual) < MIN_STEPS:
        raise ServingOverheadError(
            f"only {len(residual)} decode steps logged right after another decode step (at least "
            f"{MIN_STEPS} needed): run the server with --decode-log-interval 1 and enough requests"
        )
    x, y = np.asarray(batch), np.asarray(residual)
    if len(set(batch)) >= 2:
        b, a = np.polyfit(x, y, 1)
    else:
        a, b = float(y.mean()), 0.0
    return ServingOverhead(float(a), float(b), len(y), (int(x.min()), int(x.max())), float(y.mean()))


def add_overhead(cost: CostModel, oh: ServingOverhead, source: str) -> CostModel:
    d, p = cost.decode, cost.prefill
    table = d.table
    if table is not None:
        rows = zip(table.batch_sizes, table.ms, strict=True)
        table = DecodeTable(
            table.batch_sizes, table.context_lens, tuple(tuple(v + oh.ms(b) for v in row) for b, row in rows)
        )
    decode = replace(d, base_ms=max(d.base_ms + oh.base_ms, 0.0),
                     per_request_ms=max(d.per_request_ms + oh.per_request_ms, 0.0), table=table)  # fmt: skip
    prefill = replace(p, base_ms=max(p.base_ms + oh.base_ms, 0.0),
                      per_request_ms=max(p.per_request_ms + oh.per_request_ms, 0.0))  # fmt: skip
    meta = dict(cost.meta)
    meta["notes"] = [
        *meta.get("notes", []),
        f"+ {oh.base_ms:.2f} + {oh.per_request_ms:.3f} × requests ms per step: the serving stack beyond the "
        f"executor, from {oh.steps} decode steps ({oh.batch_sizes[0]}–{oh.batch_sizes[1]} running) of "
        f"{source}",
    ]
    meta["fit"] = {**meta.get("fit", {}), "serving_overhead_base_ms": round(oh.base_ms, 3),
                   "serving_overhead_per_request_ms": round(oh.per_request_ms, 4)}  # fmt: skip
    return CostModel(decode, prefill, meta)

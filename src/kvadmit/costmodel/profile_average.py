"""The mean of several `kvadmit profile` runs of one machine: a shared machine's slow and fast minutes
averaged out, and how far the runs differ from each other said.

Each part of a cost model is linear in its numbers (a decode table is read by interpolating between its
points; prefill takes base + per request × requests + tokens / tokens_per_s), so the mean of the numbers
predicts the mean of the runs' predictions: the table averaged point by point, base_ms and per_request_ms
averaged, and tokens_per_s averaged as ms per token (the mean of 100 and 300 tokens/s predicts 150
tokens/s, not 200: 10 and 3.33 ms per token). The runs must measure the same grid and be of the bare
executor: a serving-stack overhead (`--serving-log`) is added once, to the mean, never averaged in.
"""

from __future__ import annotations

import statistics
from dataclasses import fields, replace
from typing import Any

from kvadmit.costmodel.costmodel import CostModel, DecodeCost, DecodeTable, PrefillCost


class ProfileAverageError(ValueError):
    """The profiles cannot be averaged (different grids, not profiles, overhead already added)."""


def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def _mean_table(tables: list[DecodeTable]) -> DecodeTable:
    first = tables[0]
    rows = tuple(
        tuple(_mean([t.ms[i][j] for t in tables]) for j in range(len(first.context_lens)))
        for i in range(len(first.batch_sizes))
    )
    return DecodeTable(first.batch_sizes, first.context_lens, rows)


def _spread_pct(tables: list[DecodeTable], mean: DecodeTable) -> tuple[float, float]:
    """(mean, max) over the table's points of the largest |run − mean| / mean at that point, in %."""
    per_point = [
        max(abs(t.ms[i][j] - m) for t in tables) / m
        for i, row in enumerate(mean.ms)
        for j, m in enumerate(row)
    ]
    return 100 * _mean(per_point), 100 * max(per_point)


def _tables(models: list[CostModel], sources: list[str]) -> list[DecodeTable]:
    """The profiles' decode tables, once each profile is checked fit to average with the first."""
    if len(models) < 2:
        raise ProfileAverageError(f"averaging needs at least two profiles, got {len(models)}")
    tables: list[DecodeTable] = []
    for model, source in zip(models, sources, strict=True):
        table, d = model.decode.table, model.decode
        if table is None:
            raise ProfileAverageError(
                f"{source} has no measured decode table: not written by kvadmit profile"
            )
        if d.compute_per_request_ms or d.compute_per_kv_token_ms or model.prefill.memory_ms:
            raise ProfileAverageError(
                f"{source} has roofline terms (compute, memory): not a measured profile"
            )
        if "serving_overhead_base_ms" in model.meta.get("fit", {}):
            raise ProfileAverageError(
                f"{source} already has a serving-stack overhead (--serving-log): average profiles of the "
                "bare executor and give --serving-log to the average"
            )
        first = tables[0] if tables else table
        if (table.batch_sizes, table.context_lens) != (first.batch_sizes, first.context_lens):
            raise ProfileAverageError(
                f"{source} measured batch sizes {list(table.batch_sizes)} × context lengths "
                f"{list(table.context_lens)}, {sources[0]} {list(first.batch_sizes)} × "
                f"{list(first.context_lens)}: profiles to average must measure the same grid"
            )
        tables.append(table)
    return tables


def average_profiles(models: list[CostModel], sources: list[str]) -> CostModel:
    """The mean of `models` (profiles of the same grid, named `sources` in errors and notes)."""
    tables = _tables(models, sources)
    table = _mean_table(tables)
    decode_fields = [f.name for f in fields(DecodeCost) if f.name != "table"]
    decode = replace(
        DecodeCost(**{name: _mean([getattr(m.decode, name) for m in models]) for name in decode_fields}),
        table=table,
    )
    ms_per_token = _mean([1000 / m.prefill.tokens_per_s for m in models])
    prefill = PrefillCost(
        base_ms=_mean([m.prefill.base_ms for m in models]),
        tokens_per_s=1000 / ms_per_token,  # > 0: every tokens_per_s is finite and > 0
        per_request_ms=_mean([m.prefill.per_request_ms for m in models]),
        per_cached_token_ms=_mean([m.prefill.per_cached_token_ms for m in models]),
    )
    spread_mean, spread_max = _spread_pct(tables, table)
    meta: dict[str, Any] = dict(models[0].meta)
    meta["source"] = f"kvadmit profile --average (the mean of {len(models)} measured profiles)"
    meta["notes"] = [
        *meta.get("notes", []),
        f"the mean of {len(models)} profiles ({', '.join(sources)}); their decode step times differ from "
        f"the mean by up to {spread_mean:.1f}% at a grid point on average, {spread_max:.1f}% at most",
    ]
    fits = [m.meta.get("fit", {}) for m in models]
    fit = {
        key: round(_mean([float(f[key]) for f in fits]), 3) for key in fits[0] if all(key in f for f in fits)
    }
    fit.update(
        profiles_averaged=len(models),
        profile_spread_mean_pct=round(spread_mean, 2),
        profile_spread_max_pct=round(spread_max, 2),
    )
    meta["fit"] = fit
    return CostModel(decode, prefill, meta)

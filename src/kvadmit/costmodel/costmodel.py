"""Step-time cost models for the simulated executor: one JSON format for every source (flags, roofline
presets, calibration from an SGLang log, `kvadmit profile`).

A decode step of B requests holding K KV tokens in all costs

    max(base_ms + per_request_ms × B + per_kv_token_ms × K,                (memory side: weights, KV reads)
        compute_per_request_ms × B + compute_per_kv_token_ms × K)          (compute side: FLOPs)

a prefill step of R requests computing N new tokens over C cached ones costs

    base_ms + per_request_ms × R + per_cached_token_ms × C + max(N / tokens_per_s, memory_ms)

(memory_ms is the floor of reading the weights once; a tiny prefill cannot be faster than that).

A decode part may instead carry the measured step times themselves (`kvadmit profile` writes them): a
grid `table` of batch sizes × context tokens per request, read by interpolation (DecodeTable). A real
engine's step time is not linear in the batch size (on a CPU, one request takes a matrix-vector path
and two a matrix-matrix one at twice the cost), and the table keeps that shape; the coefficients then
only describe the fit, for reading.
Every coefficient not given is 0, so the simplest form is a constant decode step (`--decode-step-ms`) and
a prefill throughput (`--prefill-throughput`); a file gives any of them:

    {"name": "h100:llama-3-8b",
     "decode": {"base_ms": 6.0, "per_kv_token_ms": 0.0000489, "compute_per_request_ms": 0.0325},
     "prefill": {"tokens_per_s": 42000, "memory_ms": 6.0},
     "notes": ["how it was derived"], "fit": {...}}

`name`, `source`, `notes` and `fit` are descriptive; only `decode` and `prefill` change step times.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field, fields
from typing import Any

from kvadmit.pickling import by_fields

METADATA_KEYS = ("name", "source", "notes", "fit")


class CostModelError(ValueError):
    """The cost model file or flags are wrong; the message says which coefficient and why."""


def _between(x: float, x0: float, x1: float, y0: float, y1: float, rising: bool = True) -> float:
    """The line through (x0, y0) and (x1, y1) at x; past x1 its slope is floored at 0 when `rising` (a
    noisy last pair must not make a larger step cheaper than the largest measured one)."""
    if x1 == x0:
        return y0
    slope = (y1 - y0) / (x1 - x0)
    if x > x1 and rising:
        return y1 + max(slope, 0.0) * (x - x1)
    return y0 + slope * (x - x0)


def _segment(points: tuple[int, ...], x: float) -> tuple[int, int]:
    """Indices (i, i + 1) of the grid segment that holds x (the first or last one outside the grid)."""
    if len(points) == 1:
        return 0, 0
    i = bisect.bisect_right(points, x) - 1
    i = min(max(i, 0), len(points) - 2)
    return i, i + 1


@dataclass(frozen=True, slots=True)
class DecodeTable:
    """Measured decode step times: ms[i][j] for batch_sizes[i] requests each holding context_lens[j] KV
    tokens. A batch of B requests holding K tokens in all is read at (B, K / B): linear between the grid
    points in both directions; below the smallest batch size its row, below the smallest context its
    column; above the largest of either, the last segment's line, its slope floored at 0 (beyond the
    grid a step never gets cheaper)."""

    batch_sizes: tuple[int, ...]
    context_lens: tuple[int, ...]
    ms: tuple[tuple[float, ...], ...]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # (kvadmit/pickling.py: compiled, a frozen field refuses the restore)

    def row_ms(self, i: int, context: float) -> float:
        row, lens = self.ms[i], self.context_lens
        if context <= lens[0]:
            return row[0]  # no cheaper than measured: a line drawn below the grid would fall towards 0
        j0, j1 = _segment(lens, context)
        return _between(context, lens[j0], lens[j1], row[j0], row[j1])

    def step_ms(self, batch_size: float, kv_tokens: float) -> float:
        context = kv_tokens / batch_size if batch_size else 0.0
        sizes = self.batch_sizes
        b = max(batch_size, sizes[0])
        i0, i1 = _segment(sizes, b)
        value = _between(b, sizes[i0], sizes[i1], self.row_ms(i0, context), self.row_ms(i1, context))
        return max(value, 0.0)

    @classmethod
    def from_dict(cls, data: Any) -> DecodeTable:
        if not isinstance(data, dict) or set(data) != {"batch_sizes", "context_lens", "ms"}:
            raise CostModelError('decode.table is an object with "batch_sizes", "context_lens" and "ms"')
        sizes, lens, ms = data["batch_sizes"], data["context_lens"], data["ms"]
        for name, axis in (("batch_sizes", sizes), ("context_lens", lens)):
            if (
                not isinstance(axis, list)
                or not axis
                or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in axis)
                or axis != sorted(set(axis))
            ):
                raise CostModelError(f"decode.table.{name} must list positive integers, rising, got {axis!r}")
        if not isinstance(ms, list) or len(ms) != len(sizes):
            raise CostModelError(f"decode.table.ms must have one row per batch size ({len(sizes)})")
        for i, row in enumerate(ms):
            if (
                not isinstance(row, list)
                or len(row) != len(lens)
                or any(isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 for v in row)
            ):
                raise CostModelError(
                    f"decode.table.ms[{i}] must be {len(lens)} step times in ms > 0 (one per context "
                    f"length), got {row!r}"
                )
        return cls(tuple(sizes), tuple(lens), tuple(tuple(float(v) for v in row) for row in ms))

    def to_dict(self) -> dict[str, Any]:
        return {"batch_sizes": list(self.batch_sizes), "context_lens": list(self.context_lens),
                "ms": [list(row) for row in self.ms]}  # fmt: skip


@dataclass(frozen=True, slots=True)
class DecodeCost:
    base_ms: float = 20.0
    per_request_ms: float = 0.0
    per_kv_token_ms: float = 0.0
    compute_per_request_ms: float = 0.0
    compute_per_kv_token_ms: float = 0.0
    table: DecodeTable | None = None  # measured step times; when given, the coefficients are not used

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # (kvadmit/pickling.py: compiled, a frozen field refuses the restore)

    def seconds(self, batch_size: float, kv_tokens: float) -> float:
        # (float: calibration reads a window's averages; the compiled core checks argument types)
        if self.table is not None:
            return self.table.step_ms(batch_size, kv_tokens) / 1000
        memory = self.base_ms + self.per_request_ms * batch_size + self.per_kv_token_ms * kv_tokens
        compute = self.compute_per_request_ms * batch_size + self.compute_per_kv_token_ms * kv_tokens
        return max(memory, compute) / 1000

    @property
    def needs_kv_tokens(self) -> bool:
        """Whether the KV tokens of the batch change the step time (else the caller may pass 0)."""
        if self.table is not None:
            return len(self.table.context_lens) > 1
        return bool(self.per_kv_token_ms or self.compute_per_kv_token_ms)


@dataclass(frozen=True, slots=True)
class PrefillCost:
    base_ms: float = 0.0
    tokens_per_s: float = 10_000.0
    per_request_ms: float = 0.0
    per_cached_token_ms: float = 0.0
    memory_ms: float = 0.0

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # (kvadmit/pickling.py: compiled, a frozen field refuses the restore)

    def seconds(self, requests: int, new_tokens: int, cached_tokens: int) -> float:
        fixed = self.base_ms + self.per_request_ms * requests + self.per_cached_token_ms * cached_tokens
        return fixed / 1000 + max(new_tokens / self.tokens_per_s, self.memory_ms / 1000)


@dataclass(frozen=True, slots=True)
class CostModel:
    decode: DecodeCost = DecodeCost()
    prefill: PrefillCost = PrefillCost()
    # Descriptive only: what the model is and how it was made (kept when written back to a file).
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # (kvadmit/pickling.py: compiled, a frozen field refuses the restore)

    @property
    def name(self) -> str:
        return str(self.meta.get("name", ""))

    @classmethod
    def simple(cls, decode_step_ms: float, prefill_tokens_per_s: float) -> CostModel:
        if not decode_step_ms > 0:
            raise CostModelError(f"--decode-step-ms must be > 0, got {decode_step_ms}")
        if not prefill_tokens_per_s > 0:
            raise CostModelError(f"--prefill-throughput must be > 0 tokens/s, got {prefill_tokens_per_s}")
        return cls(DecodeCost(base_ms=decode_step_ms), PrefillCost(tokens_per_s=prefill_tokens_per_s))

    @classmethod
    def from_dict(cls, data: Any) -> CostModel:
        if not isinstance(data, dict):
            raise CostModelError('a cost model is a JSON object with "decode" and "prefill" parts')
        unknown = set(data) - {"decode", "prefill", *METADATA_KEYS}
        if unknown:
            raise CostModelError(
                f"unknown cost model part(s) {sorted(unknown)}; allowed: decode, prefill, "
                + ", ".join(METADATA_KEYS)
            )
        return cls(
            _part(DecodeCost, data.get("decode", {}), "decode"),
            _part(PrefillCost, data.get("prefill", {}), "prefill"),
            {k: data[k] for k in METADATA_KEYS if k in data},
        )

    @classmethod
    def from_file(cls, path: str) -> CostModel:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise CostModelError(f"cannot read cost model {path!r}: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise CostModelError(
                f"cost model {path!r} is not valid JSON: {e.msg} (line {e.lineno})"
            ) from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """The file form: metadata first, then every coefficient (zeros included, so a reader sees all)."""
        out: dict[str, Any] = {k: self.meta[k] for k in ("name", "source") if k in self.meta}
        coefficients = [f.name for f in fields(DecodeCost) if f.name != "table"]
        out["decode"] = {name: getattr(self.decode, name) for name in coefficients}
        if self.decode.table is not None:
            out["decode"]["table"] = self.decode.table.to_dict()
        out["prefill"] = {f.name: getattr(self.prefill, f.name) for f in fields(PrefillCost)}
        out.update({k: self.meta[k] for k in ("notes", "fit") if k in self.meta})
        return out

    def write(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")


def _part(kind: type, values: Any, name: str) -> Any:
    if not isinstance(values, dict):
        raise CostModelError(f"cost model part {name!r} must be an object")
    table = None
    if name == "decode" and "table" in values:
        values = dict(values)
        table = DecodeTable.from_dict(values.pop("table"))
    allowed = {f.name for f in fields(kind)} - {"table"}
    for key, value in values.items():
        if key not in allowed:
            raise CostModelError(f"unknown {name} coefficient {key!r}; allowed: {', '.join(sorted(allowed))}")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise CostModelError(f"{name}.{key} must be a number ≥ 0, got {value!r}")
    if name == "prefill" and values.get("tokens_per_s", 1) <= 0:
        raise CostModelError("prefill.tokens_per_s must be > 0")
    coefficients = {k: float(v) for k, v in values.items()}
    return kind(**coefficients, table=table) if table is not None else kind(**coefficients)

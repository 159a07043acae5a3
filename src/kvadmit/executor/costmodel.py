"""Step-time cost models for the simulated executor: one JSON format for every source (flags, roofline
presets, calibration from an SGLang log, `kvadmit profile`).

A decode step of B requests holding K KV tokens in all costs

    max(base_ms + per_request_ms × B + per_kv_token_ms × K,                (memory side: weights, KV reads)
        compute_per_request_ms × B + compute_per_kv_token_ms × K)          (compute side: FLOPs)

a prefill step of R requests computing N new tokens over C cached ones costs

    base_ms + per_request_ms × R + per_cached_token_ms × C + max(N / tokens_per_s, memory_ms)

(memory_ms is the floor of reading the weights once; a tiny prefill cannot be faster than that).
Every coefficient not given is 0, so the simplest form is a constant decode step (`--decode-step-ms`) and
a prefill throughput (`--prefill-throughput`); a file gives any of them:

    {"name": "h100:llama-3-8b",
     "decode": {"base_ms": 6.0, "per_kv_token_ms": 0.0000489, "compute_per_request_ms": 0.0325},
     "prefill": {"tokens_per_s": 42000, "memory_ms": 6.0},
     "notes": ["how it was derived"], "fit": {...}}

`name`, `source`, `notes` and `fit` are descriptive; only `decode` and `prefill` change step times.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

METADATA_KEYS = ("name", "source", "notes", "fit")


class CostModelError(ValueError):
    """The cost model file or flags are wrong; the message says which coefficient and why."""


@dataclass(frozen=True, slots=True)
class DecodeCost:
    base_ms: float = 20.0
    per_request_ms: float = 0.0
    per_kv_token_ms: float = 0.0
    compute_per_request_ms: float = 0.0
    compute_per_kv_token_ms: float = 0.0

    def seconds(self, batch_size: int, kv_tokens: int) -> float:
        memory = self.base_ms + self.per_request_ms * batch_size + self.per_kv_token_ms * kv_tokens
        compute = self.compute_per_request_ms * batch_size + self.compute_per_kv_token_ms * kv_tokens
        return max(memory, compute) / 1000

    @property
    def needs_kv_tokens(self) -> bool:
        """Whether the KV tokens of the batch change the step time (else the caller may pass 0)."""
        return bool(self.per_kv_token_ms or self.compute_per_kv_token_ms)


@dataclass(frozen=True, slots=True)
class PrefillCost:
    base_ms: float = 0.0
    tokens_per_s: float = 10_000.0
    per_request_ms: float = 0.0
    per_cached_token_ms: float = 0.0
    memory_ms: float = 0.0

    def seconds(self, requests: int, new_tokens: int, cached_tokens: int) -> float:
        fixed = self.base_ms + self.per_request_ms * requests + self.per_cached_token_ms * cached_tokens
        return fixed / 1000 + max(new_tokens / self.tokens_per_s, self.memory_ms / 1000)


@dataclass(frozen=True, slots=True)
class CostModel:
    decode: DecodeCost = DecodeCost()
    prefill: PrefillCost = PrefillCost()
    # Descriptive only: what the model is and how it was made (kept when written back to a file).
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

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
        out["decode"] = {f.name: getattr(self.decode, f.name) for f in fields(DecodeCost)}
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
    allowed = {f.name for f in fields(kind)}
    for key, value in values.items():
        if key not in allowed:
            raise CostModelError(f"unknown {name} coefficient {key!r}; allowed: {', '.join(sorted(allowed))}")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise CostModelError(f"{name}.{key} must be a number ≥ 0, got {value!r}")
    if name == "prefill" and values.get("tokens_per_s", 1) <= 0:
        raise CostModelError("prefill.tokens_per_s must be > 0")
    return kind(**{k: float(v) for k, v in values.items()})

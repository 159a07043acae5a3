"""Step-time cost models for the simulated executor.

A prefill step costs   base_ms + per_request_ms × requests + new_tokens / tokens_per_s
                       + per_cached_token_ms × cached tokens read;
a decode step costs    base_ms + per_request_ms × batch size + per_kv_token_ms × KV tokens read.

The simplest form is a constant decode step (`--decode-step-ms`) and a prefill throughput
(`--prefill-throughput`); a JSON file gives every coefficient:

    {"decode": {"base_ms": 8.0, "per_request_ms": 0.05, "per_kv_token_ms": 0.00002},
     "prefill": {"base_ms": 5.0, "tokens_per_s": 20000, "per_request_ms": 0.1}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any


class CostModelError(ValueError):
    """The cost model file or flags are wrong; the message says which coefficient and why."""


@dataclass(frozen=True, slots=True)
class DecodeCost:
    base_ms: float = 20.0
    per_request_ms: float = 0.0
    per_kv_token_ms: float = 0.0

    def seconds(self, batch_size: int, kv_tokens: int) -> float:
        return (self.base_ms + self.per_request_ms * batch_size + self.per_kv_token_ms * kv_tokens) / 1000


@dataclass(frozen=True, slots=True)
class PrefillCost:
    base_ms: float = 0.0
    tokens_per_s: float = 10_000.0
    per_request_ms: float = 0.0
    per_cached_token_ms: float = 0.0

    def seconds(self, requests: int, new_tokens: int, cached_tokens: int) -> float:
        fixed = self.base_ms + self.per_request_ms * requests + self.per_cached_token_ms * cached_tokens
        return fixed / 1000 + new_tokens / self.tokens_per_s


@dataclass(frozen=True, slots=True)
class CostModel:
    decode: DecodeCost = DecodeCost()
    prefill: PrefillCost = PrefillCost()

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
        unknown = set(data) - {"decode", "prefill", "name", "notes"}
        if unknown:
            raise CostModelError(f"unknown cost model part(s) {sorted(unknown)}; allowed: decode, prefill")
        return cls(
            _part(DecodeCost, data.get("decode", {}), "decode"),
            _part(PrefillCost, data.get("prefill", {}), "prefill"),
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

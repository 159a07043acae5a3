"""Sampling parameters with SGLang's names, defaults and ranges (torch-free: requests carry them)."""

from __future__ import annotations

from dataclasses import dataclass


class SamplingError(ValueError):
    """A sampling parameter is out of range; the message names it and says what is allowed."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # −1: all tokens
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise SamplingError(f"temperature must be ≥ 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise SamplingError(f"top_k must be −1 (all) or ≥ 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise SamplingError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

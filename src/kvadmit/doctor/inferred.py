"""A figure the doctor inferred from a log, with how it was inferred and how sure it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

T = TypeVar("T")
Confidence = Literal["exact", "estimate", "guess"]


@dataclass(frozen=True, slots=True)
class Inferred(Generic[T]):
    value: T
    how: str
    confidence: Confidence

    def to_json(self) -> dict[str, object]:
        value: object = self.value
        if isinstance(value, float):
            value = round(value, 4)
        return {"value": value, "how": self.how, "confidence": self.confidence}

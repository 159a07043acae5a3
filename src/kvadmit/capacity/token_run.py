"""Synthetic token ids that cost no memory: a snapshot's request has a length, not tokens, so its ids are
made up (unique to it) and a waiting prompt of any length, 10**9 tokens or more, must not be built as a list.

The scheduler reads a waiting request's tokens only through len(), prompt + outputs, single ids and
slices (the prefix-cache walk reads a slice at most as long as a cached node, so never more than the
pool). A TokenRun answers each of those as a list would, keeping two integers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload


class TokenRun(Sequence[int]):
    """The ids start, start + 1, …, start + n − 1. A slice is a list of just its ids; a run followed by
    the run that continues it (a prompt and its outputs) is one longer run."""

    __slots__ = ("n", "start")

    def __init__(self, start: int, n: int) -> None:
        self.start = start
        self.n = n

    def _ids(self) -> range:
        return range(self.start, self.start + self.n)

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return list(self._ids()[index])
        return self._ids()[index]  # (IndexError past either end, as a list's)

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids())

    def __contains__(self, value: object) -> bool:
        return value in self._ids()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenRun):
            return self._ids() == other._ids()
        if isinstance(other, list | tuple):
            return len(other) == self.n and all(a == b for a, b in zip(self._ids(), other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compares equal to lists, which are unhashable

    def __add__(self, other: Any) -> Sequence[int]:
        if isinstance(other, TokenRun) and (other.start == self.start + self.n or other.n == 0):
            return TokenRun(self.start, self.n + other.n)
        if isinstance(other, list | tuple) and not other:
            return self
        if isinstance(other, TokenRun | list | tuple):
            return list(self) + list(other)
        return NotImplemented

    def __radd__(self, other: Any) -> Sequence[int]:
        if isinstance(other, list | tuple):
            return self if not other else list(other) + list(self)
        return NotImplemented

    def __repr__(self) -> str:
        return f"TokenRun({self.start}, {self.n})"

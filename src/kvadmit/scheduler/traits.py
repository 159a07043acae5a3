"""`@trait` for the Scheduler's mixins: what mypyc needs to compile a class with several bases (the
compiled core, kvadmit/native.py). mypy and mypyc see mypy_extensions.trait; at run time it is the
identity, so the scheduler still imports only the standard library."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

T = TypeVar("T")

if TYPE_CHECKING:
    from mypy_extensions import trait
else:

    def trait(cls: T) -> T:
        """A mixin of the Scheduler (never instantiated alone)."""
        return cls


__all__ = ["trait"]

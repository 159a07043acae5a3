"""Pickling for the frozen dataclasses of the compiled core (kvadmit.native.COMPILED).

A slotted dataclass pickles as its field values and unpickles by setting them one by one with
object.__setattr__; mypyc compiles a frozen field's setter to raise FrozenInstanceError, so a compiled
frozen class cannot be restored that way. Such a class defines `__reduce__` with `by_fields`: it is
rebuilt by its constructor instead (the same object in pure Python and compiled, for pickle, copy and
deepcopy: a sweep's worker processes and Ray receive their configurations so).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any


def by_fields(obj: Any) -> tuple[Any, tuple[Any, ...]]:
    """`obj.__reduce__()` for a dataclass whose fields are all constructor arguments, in order."""
    return type(obj), tuple(getattr(obj, f.name) for f in fields(obj))

"""Pickling for the frozen dataclasses of the compiled core (kvadmit.native.COMPILED).

A slotted dataclass pickles as its field values and unpickles by setting them one by one
(dataclass's `__setstate__`, object.__setattr__ field by field); on a frozen class compiled by mypyc that
raises FrozenInstanceError (the compiled core's own code sets such fields natively, but this is Python
calling in). Such a class defines `__reduce__` with `by_fields`: it is rebuilt by its constructor
instead, the same object in pure Python and compiled, for pickle, copy and deepcopy (a sweep's worker
processes and Ray receive their configurations so).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any


def by_fields(obj: Any) -> tuple[Any, tuple[Any, ...]]:
    """`obj.__reduce__()` for a dataclass whose fields are all constructor arguments, in order."""
    return type(obj), tuple(getattr(obj, f.name) for f in fields(obj))

"""The memory package's exception (its own module: mypyc compiles pool.py, and a compiled class cannot
derive from RuntimeError; an interpreted one raised from compiled code behaves as before)."""

from __future__ import annotations


class OutOfSlots(RuntimeError):
    """An allocation asked for more slots than are free (a scheduler bug: admission must prevent it)."""

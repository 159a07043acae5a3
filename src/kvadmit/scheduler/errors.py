"""The scheduler's crash exception (its own module: mypyc compiles types.py, and a compiled class cannot
derive from RuntimeError; an interpreted one raised from compiled code behaves as before)."""

from __future__ import annotations


class EngineCrash(RuntimeError):
    """What an SGLang release before 0.5.10 did when even the last request did not fit: the server died."""

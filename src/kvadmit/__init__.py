"""kvadmit: an LLM serving engine whose scheduler makes SGLang 0.5.22's admission and retraction
decisions, and the tools to see why requests wait."""

from kvadmit import native

native.install()  # the compiled core (make fast) when it is built and current; pure Python otherwise

__version__ = "0.1.0"

__all__ = ["Engine", "OfflineEngine"]


def __getattr__(name: str) -> object:
    """`kvadmit.OfflineEngine` (kvadmit/offline.py), also `kvadmit.Engine` (SGLang's name for its offline
    engine, kept as an alias), loads torch only when asked for."""
    if name in ("Engine", "OfflineEngine"):
        from kvadmit.offline import OfflineEngine

        return OfflineEngine
    raise AttributeError(name)

"""kvadmit: an LLM serving engine whose scheduler makes SGLang 0.5.22's admission and retraction
decisions, and the tools to see why requests wait."""

__version__ = "0.1.0"

__all__ = ["Engine"]


def __getattr__(name: str) -> object:
    """`kvadmit.Engine` loads torch only when asked for."""
    if name == "Engine":
        from kvadmit.api import Engine

        return Engine
    raise AttributeError(name)

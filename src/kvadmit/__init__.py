"""kvadmit: an LLM serving engine whose scheduler makes SGLang 0.5.22's admission and retraction
decisions, and the tools to see why requests wait."""

__version__ = "0.1.0"

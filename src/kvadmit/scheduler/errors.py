"""The scheduler's crash exception (its own module: mypyc compiles types.py, and a compiled class cannot
derive from RuntimeError; an interpreted one raised from compiled code behaves as before)."""

from __future__ import annotations


class EngineCrash(RuntimeError):
    """What an SGLang release before 0.5.10 did when even the last request did not fit: the server died."""


# The advice every SGLang release's KV allocation failure carries, after "Out of memory", "Prefill out of
# memory" or (older releases, in a decode step) "Decode out of memory": what the doctor looks for.
BATCH_SIZE_HINT = "Try to lower your batch size."


def out_of_memory_message(tokens: int, available: int, evictable: int, page_size: int) -> str:
    """SGLang 0.5.22's error when a prefill batch's KV cannot be allocated even after evicting the cache
    (`alloc_token_slots` with pages of one token, `alloc_paged_token_slots_extend` with larger pages); the
    scheduler process raises it and the server dies. `available` and `evictable` are read after the
    eviction, as SGLang prints them."""
    head = "Out of memory" if page_size == 1 else "Prefill out of memory"
    return (
        f"RuntimeError: {head}. {BATCH_SIZE_HINT}\nTry to allocate {tokens} tokens.\n"
        f"Available full tokens: {available + evictable} "
        f"(full_available_size={available} + full_evictable_size_={evictable})"
    )

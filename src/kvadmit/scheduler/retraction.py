"""Retraction: before each decode step every running request needs a slot; if the pool cannot give
them, running requests are taken out and re-queued (SGLang's check_decode_mem / retract_decode, §3)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvadmit.memory.pool import TokenPool
from kvadmit.memory.radix import RadixCache
from kvadmit.request import Req

LAST_REQUEST_ABORT_MESSAGE = (
    "Out of memory even after retracting all other requests in the decode batch. Aborting the last request."
)
LAST_REQUEST_VALUE_ERROR = "Out of memory even after retracting all other requests in the decode batch."
LAST_REQUEST_ASSERTION = "No space left for only one request"


def evict_for(cache: RadixCache, pool: TokenPool, num_tokens: int) -> None:
    """Make `num_tokens` free by evicting unlocked cache entries, if the pool is short of them.

    The reference (0.5.22 wheel) says the shortfall is evicted; older sources ask the cache for the full
    `num_tokens`. Eviction removes whole LRU leaves either way, and the decisions (whether the pool can
    hold the next step) are the same; only `#new_tokens_gained` can differ between the two readings.
    """
    available = pool.available_size()
    if available < num_tokens:
        cache.evict(num_tokens - available)


def decode_tokens_needed(reqs: list[Req], page_size: int) -> int:
    """Slots the next decode step takes: a new page for every request whose KV fills whole pages."""
    if page_size == 1:
        return len(reqs)
    return page_size * sum(1 for r in reqs if len(r.kv) % page_size == 0)


def check_decode_mem(reqs: list[Req], cache: RadixCache, pool: TokenPool, page_size: int) -> bool:
    """Can every request in `reqs` get its next slot? Evicts unlocked cache first if needed."""
    needed = decode_tokens_needed(reqs, page_size)
    evict_for(cache, pool, needed)
    return pool.available_size() >= needed


def retraction_order(reqs: list[Req]) -> list[int]:
    """Indices in keep-preference order: most outputs first, then shorter prompt first. Victims are
    taken from the end (fewest outputs, then longest prompt). The sort is stable, so on a full tie the
    later request in batch order sits later and goes first."""
    return sorted(
        range(len(reqs)),
        key=lambda i: (len(reqs[i].output_ids), -len(reqs[i].origin_input_ids)),
        reverse=True,
    )


@dataclass(slots=True)
class RetractResult:
    retracted: list[Req]  # in retraction order
    kept: list[Req]  # in keep-preference order (SGLang leaves the batch so)
    last_request: Req | None  # the last request, when even it alone does not fit


def retract_decode(
    reqs: list[Req],
    cache: RadixCache,
    pool: TokenPool,
    page_size: int,
    retract_decode_steps: int,
    release: Callable[[Req], None],
    order_by: Callable[[list[Req]], list[int]] = retraction_order,
) -> RetractResult:
    """Retract at least one request (never the last inside the loop), until the rest fit the next step.

    `release(req)` frees a victim's own KV and request slot without caching its tokens. After each
    victim, the cache is evicted so that `retract_decode_steps` tokens per remaining request are free.
    `order_by` gives the keep-preference order (SGLang's by default; see scheduler/policy.py).
    """
    order = order_by(reqs)
    retracted: list[Req] = []
    first = True
    while first or not check_decode_mem([reqs[i] for i in order], cache, pool, page_size):
        first = False
        if len(order) == 1:
            break
        victim = reqs[order.pop()]
        retracted.append(victim)
        release(victim)
        evict_for(cache, pool, len(order) * retract_decode_steps)
        victim.reset_for_retract()

    last: Req | None = None
    if len(order) <= 1 and order and not check_decode_mem([reqs[order[0]]], cache, pool, page_size):
        last = reqs[order.pop()]
    return RetractResult(retracted=retracted, kept=[reqs[i] for i in order], last_request=last)

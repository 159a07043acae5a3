"""The scheduler's accounting invariants (docs/architecture.md), checked after every call by the tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvadmit.memory.pool import pages_for

if TYPE_CHECKING:
    from kvadmit.scheduler.scheduler import Scheduler


def check_invariants(sched: Scheduler) -> None:
    """docs/architecture.md's pool accounting: free + evictable + locked + held by requests == pool
    size."""
    sched.running.settle_all()  # (owed decode slots: written out, as reading the arrays does)
    held_pages = 0
    live = {id(r): r for r in sched.running.reqs if not r.finished}
    if sched.chunked_req is not None:
        live[id(sched.chunked_req)] = sched.chunked_req
    for batch in (sched.last_batch, sched.in_flight):
        if batch is not None and batch.kind == "prefill":
            live.update((id(r), r) for r in batch.reqs if not r.finished and r.kv)
    live.update((id(r), r) for r in sched._dropped_finishing if not r.finished)
    for req in live.values():
        own = len(req.kv) - req.cached_len
        held_pages += pages_for(own, sched.pool.page_size)
    total = (
        sched.pool.available_size()
        + sched.cache.evictable_size()
        + sched.cache.protected_size()
        + held_pages * sched.pool.page_size
    )
    if total != sched.max_total_num_tokens:
        raise AssertionError(
            f"pool accounting broken: free {sched.pool.available_size()} + evictable "
            f"{sched.cache.evictable_size()} + locked {sched.cache.protected_size()} + held "
            f"{held_pages * sched.pool.page_size} = {total} != {sched.max_total_num_tokens}"
        )
    if sched.running.kv_tokens != sum(map(len, sched.running.kvs)):
        raise AssertionError(f"running KV sum {sched.running.kv_tokens} is out of step with the batch")
    if sched._waiting_tokens != sum(r.seqlen for r in sched.waiting):
        raise AssertionError(f"waiting-token count {sched._waiting_tokens} is out of step with the queue")
    if sched.req_slots.size - sched.req_slots.available_size() != len(live):
        raise AssertionError(
            f"request slots: {sched.req_slots.size - sched.req_slots.available_size()} in use, "
            f"{len(live)} live requests"
        )

"""Waiting-queue order for each scheduling pass (`--schedule-policy`, docs/sglang-rules.md §1.2).

The queue is sorted in place once per pass; admission then walks it in that order and stops at the first
request that does not fit (head-of-line blocking).
"""

from __future__ import annotations

import random

from kvadmit.memory.pool import TokenPool, new_slots
from kvadmit.memory.radix import RadixCache
from kvadmit.request import Req
from kvadmit.scheduler.priority import PriorityScheduling

WAITING_QUEUE_PREFIX_MATCH_MAX = 128  # above this many waiting, lpm falls back to fcfs for the pass
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32  # a match this short is checked against other waiting reqs
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32  # sharing this much with an earlier one defers it
WAITING_PREFIX_REFRESH_INTERVAL = 32  # a cache-agnostic order refreshes the waiting prefixes every 32nd pass


class QueueOrder:
    def __init__(
        self, policy: str, cache: RadixCache, seed: int = 0, prio: PriorityScheduling | None = None
    ) -> None:
        self.policy = policy
        self.cache = cache
        self.rng = random.Random(seed)
        self.refresh_calls = 0
        # priority scheduling (fcfs and lof only: ServerArgs.check_startup refuses the others with it)
        self.prio = prio if prio is not None and prio.enabled else None

    def effective_policy(self, waiting: list[Req]) -> str:
        if self.policy == "lpm" and (not self.cache.enabled or len(waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX):
            return "fcfs"
        return self.policy

    def sort(self, waiting: list[Req]) -> None:
        policy = self.effective_policy(waiting)
        if self.prio is not None:
            # SGLang tests its configured policy here (lpm without a cache is configured as fcfs), so an
            # lpm pass that falls back to fcfs for a long queue does not sort by priority.
            configured = "fcfs" if self.policy == "lpm" and not self.cache.enabled else self.policy
            if configured == "fcfs":
                self.prio.sort_fcfs(waiting)
                self._refresh_waiting_prefixes(waiting)
                return
            if configured == "lof":
                self.prio.sort_lof(waiting)
                self._refresh_waiting_prefixes(waiting)
                return
        if policy == "lpm":
            self._sort_lpm(waiting)
            return
        if policy == "lof":
            waiting.sort(key=lambda r: -r.max_new_tokens)
        elif policy == "random":
            self.rng.shuffle(waiting)
        self._refresh_waiting_prefixes(waiting)

    def _refresh_waiting_prefixes(self, waiting: list[Req]) -> None:
        """SGLang 0.5.22 (SchedulePolicy._touch_waiting_prefixes, SGLANG_ENABLE_WAITING_PREFIX_REFRESH on
        by default, LRU eviction): under an order that does not match prefixes, every 32nd sorting pass
        marks the cached prefixes of the first 128 waiting requests as just used, the head last, so that
        LRU eviction takes what no waiting request needs first. SGLang's default cache
        (UnifiedRadixCache) touches with a full tree match, so a node the path ends inside is split
        there, as any match splits it: its cached tail can then be evicted apart from the touched head."""
        if not waiting or not self.cache.enabled:
            return
        refresh = self.refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
        self.refresh_calls += 1
        if refresh:
            for req in reversed(waiting[:WAITING_QUEUE_PREFIX_MATCH_MAX]):
                # (a bare prompt is read, not copied: the walk keeps no key)
                self.cache.refresh_prefix(req.fill_ids() if req.output_ids else req.origin_input_ids)

    def _sort_lpm(self, waiting: list[Req]) -> None:
        """Longest cached prefix first. A request with little cached that shares a long prefix with an
        earlier waiting request goes last, so that the earlier one fills the cache for it."""
        matched: dict[int, int] = {}
        deferred: set[int] = set()
        in_batch = RadixCache(TokenPool(1), page_size=1)  # keys only; its slots are never used
        for req in waiting:
            # SGLang 0.5.22 matches the whole prompt + outputs (the tree splits where that match ends) and
            # sorts by the match capped at len − 1; the in-batch check reads the uncapped match.
            key = req.fill_ids()
            n = len(self.cache.match_prefix(key).value)
            matched[id(req)] = min(n, len(key) - 1)
            if n <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
                shared = len(in_batch.match_prefix(key).value)
                if shared >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                    deferred.add(id(req))
                else:
                    in_batch.insert(key, new_slots([0]) * len(key))
        waiting.sort(key=lambda r: float("inf") if id(r) in deferred else -matched[id(r)])

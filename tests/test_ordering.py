"""Waiting-queue order (`--schedule-policy`, docs/sglang-rules.md §1.2)."""

from __future__ import annotations

from helpers import cache_with, make_req
from kvadmit.memory.pool import TokenPool
from kvadmit.memory.radix import NoPrefixCache
from kvadmit.scheduler.ordering import QueueOrder


def test_fcfs_keeps_arrival_order() -> None:
    queue = [make_req(f"q{i}", 5) for i in range(5)]
    QueueOrder("fcfs", cache_with([])).sort(queue)
    assert [q.rid for q in queue] == ["q0", "q1", "q2", "q3", "q4"]


def test_lof_puts_the_longest_output_first_and_is_stable() -> None:
    queue = [make_req("a", 5, 10), make_req("b", 5, 300), make_req("c", 5, 10), make_req("d", 5, 50)]
    QueueOrder("lof", cache_with([])).sort(queue)
    assert [q.rid for q in queue] == ["b", "d", "a", "c"]


def test_lpm_puts_the_longest_cached_prefix_first() -> None:
    shared = list(range(100, 200))
    cache = cache_with([shared])
    queue = [
        make_req("none", 50),
        make_req("some", prompt=[*shared[:40], 1, 2]),
        make_req("all", prompt=[*shared, 3]),
    ]
    QueueOrder("lpm", cache).sort(queue)
    assert [q.rid for q in queue] == ["all", "some", "none"]


def test_lpm_defers_a_request_that_shares_a_long_prefix_with_an_earlier_waiting_one() -> None:
    # Nothing is cached; b shares 40 (≥ 32) tokens with a, which is ahead of it: b goes last.
    common = list(range(500, 540))
    queue = [make_req("a", prompt=[*common, 1]), make_req("b", prompt=[*common, 2]), make_req("c", 10)]
    QueueOrder("lpm", cache_with([])).sort(queue)
    assert [q.rid for q in queue] == ["a", "c", "b"]


def test_lpm_falls_back_to_fcfs_above_128_waiting_or_without_a_cache() -> None:
    shared = list(range(100, 200))
    cache = cache_with([shared])
    queue = [make_req(f"q{i}", 5) for i in range(129)] + [make_req("hit", prompt=[*shared, 1])]
    QueueOrder("lpm", cache).sort(queue)
    assert queue[-1].rid == "hit"
    small = [make_req("x", 5), make_req("hit", prompt=[*shared, 1])]
    QueueOrder("lpm", NoPrefixCache(TokenPool(10))).sort(small)
    assert [q.rid for q in small] == ["x", "hit"]


def test_random_is_reproducible_with_a_seed() -> None:
    def order(seed: int) -> list[str]:
        queue = [make_req(f"q{i}", 5) for i in range(20)]
        QueueOrder("random", cache_with([]), seed).sort(queue)
        return [q.rid for q in queue]

    assert order(1) == order(1)
    assert order(1) != [f"q{i}" for i in range(20)]


def test_fcfs_refresh_of_waiting_prefixes_splits_the_node_the_touch_ends_inside() -> None:
    # docs/sglang-rules.md §1.2: every 32nd fcfs pass (the first included) touches each waiting request's
    # prompt with a full tree match, which splits the 18-token entry after the 7 tokens the waiting request
    # shares. An entry cached later is fresher, so evicting 1 token takes the untouched 11-token tail and
    # the waiting request still finds its 7 tokens.
    touched = list(range(1, 19))
    cache = cache_with([touched])
    waiting = [make_req("w", prompt=[*touched[:7], 50, 51])]
    QueueOrder("fcfs", cache).sort(waiting)
    cache.insert(list(range(60, 66)), cache.pool.alloc_extend([], 6))
    assert cache.evict(1) == 11
    assert len(cache.match_prefix([*touched[:7], 50]).value) == 7


def test_fcfs_refreshes_the_waiting_prefixes_only_every_32nd_pass() -> None:
    # Passes 1 to 32 do not touch (the 0th did); the 18-token entry stays whole and, the oldest, goes first.
    touched = list(range(1, 19))
    cache = cache_with([])
    order = QueueOrder("fcfs", cache)
    order.sort([make_req("x", 3)])  # the 0th pass touches (nothing is cached yet)
    cache.insert(touched, cache.pool.alloc_extend([], 18))
    waiting = [make_req("w", prompt=[*touched[:7], 50, 51])]
    order.sort(waiting)  # pass 1: no touch
    cache.insert(list(range(60, 66)), cache.pool.alloc_extend([], 6))
    assert cache.evict(1) == 18

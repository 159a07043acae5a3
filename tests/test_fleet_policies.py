"""The router's policies (sglang-router 0.3.2's rules, fleet/policies.py) in hand-made situations: every
expected choice follows from the rule as stated, by hand."""

from __future__ import annotations

import random

import pytest

from helpers import Scripted
from kvadmit.fleet.policies import CacheAware, PowerOfTwo, Random, RoundRobin, RouterView, f32, first_least
from kvadmit.fleet.router import FleetRouter, RouterSettings


def view(in_flight: list[int], polled: list[int] | None = None) -> RouterView:
    return RouterView(list(in_flight), None if polled is None else list(polled))


# ----- round_robin, random -----------------------------------------------------------------------------


def test_round_robin_cycles_from_worker_0_whatever_the_loads() -> None:
    policy = RoundRobin()
    picks = [policy.choose(view([50, 0, 9]), None) for _ in range(7)]
    assert picks == [0, 1, 2, 0, 1, 2, 0]


def test_random_takes_one_uniform_draw_over_all_workers() -> None:
    policy = Random(Scripted((3, 2), (3, 0), (3, 1)))
    assert [policy.choose(view([0, 0, 0]), None) for _ in range(3)] == [2, 0, 1]


# ----- power_of_two ------------------------------------------------------------------------------------


def test_power_of_two_second_worker_is_offset_from_the_first() -> None:
    # i = 1, then j = (1 + 1 + 0) mod 3 = 2: polled loads 10 against 3, the second wins
    assert PowerOfTwo(Scripted((3, 1), (2, 0))).choose(view([0, 0, 0], [5, 10, 3]), None) == 2
    # i = 2, then j = (2 + 1 + 1) mod 3 = 1: 9 against 4, the second wins
    assert PowerOfTwo(Scripted((3, 2), (2, 1))).choose(view([0, 0, 0], [0, 4, 9]), None) == 1
    # i = 0, j = (0 + 1 + 1) mod 3 = 2: 0 against 9, the first wins
    assert PowerOfTwo(Scripted((3, 0), (2, 1))).choose(view([0, 0, 0], [0, 4, 9]), None) == 0


def test_power_of_two_tie_goes_to_the_first_drawn() -> None:
    assert PowerOfTwo(Scripted((3, 2), (2, 1))).choose(view([0, 0, 0], [0, 7, 7]), None) == 2
    assert PowerOfTwo(Scripted((3, 1), (2, 0))).choose(view([0, 0, 0], [0, 7, 7]), None) == 1


def test_power_of_two_never_draws_the_same_worker_twice() -> None:
    for n in (2, 3, 5):
        for i in range(n):
            for r in range(n - 1):
                j = (i + 1 + r) % n
                assert j != i
                loads = [100] * n
                loads[i] = 0  # the first drawn is the least loaded: it wins
                assert PowerOfTwo(Scripted((n, i), (n - 1, r))).choose(view([0] * n, loads), None) == i
                loads[i], loads[j] = 100, 0  # now the second drawn must win
                assert PowerOfTwo(Scripted((n, i), (n - 1, r))).choose(view([0] * n, loads), None) == j


def test_power_of_two_before_the_first_poll_compares_the_routers_own_counts() -> None:
    assert PowerOfTwo(Scripted((2, 0), (1, 0))).choose(view([3, 0]), None) == 1
    assert PowerOfTwo(Scripted((2, 0), (1, 0))).choose(view([0, 0]), None) == 0


def test_power_of_two_with_one_worker_draws_nothing() -> None:
    assert PowerOfTwo(Scripted()).choose(view([4], [99]), None) == 0


def test_power_of_two_with_a_seed_follows_pythons_draws() -> None:
    loads = [30, 10, 20, 10]
    router = FleetRouter(RouterSettings("power_of_two", seed=7), 4)
    router.view.polled = loads
    rng = random.Random(7)
    expected = []
    for _ in range(20):
        i = rng.randrange(4)
        j = (i + 1 + rng.randrange(3)) % 4
        expected.append(i if loads[i] <= loads[j] else j)
    assert [router.route(None) for _ in range(20)] == expected
    assert router.view.in_flight == [0, 0, 0, 0]  # 0.3.2 keeps no in-flight count under power_of_two


# ----- cache_aware -------------------------------------------------------------------------------------


def cache_aware(workers: int, **kw: float) -> CacheAware:
    policy = CacheAware(**kw)  # type: ignore[arg-type]
    policy.start(workers)
    return policy


def test_cache_aware_match_exactly_at_the_threshold_is_not_above_it() -> None:
    policy = cache_aware(2)
    policy.tree.insert("abcxyz", 1)
    # 3 of 10 characters match worker 1's text: 0.3 is not above 0.3, so the least loaded (worker 0)
    assert policy.choose(view([0, 3]), "abcdefghij") == 0
    policy = cache_aware(2)
    policy.tree.insert("abcxyz", 1)
    # 3 of 9: 0.333 > 0.3, so worker 1, which holds the prefix, though it has more in flight
    assert policy.choose(view([0, 3]), "abcdefghi") == 1


def test_cache_aware_compares_the_match_rate_in_32_bit_floats() -> None:
    # 3,000,001 / 10,000,003 = 0.3 + 1.0e-8 in 64 bits; in 32 bits it rounds to 0.3's own f32 (spacing
    # 3.0e-8 there), which is not above the threshold
    matched, total = 3_000_001, 10_000_003
    assert matched / total > 0.3 and f32(matched / total) == f32(0.3)
    text = "a" * matched + "b" * (total - matched)
    policy = cache_aware(2)
    policy.tree.insert("a" * matched + "c", 1)
    assert policy.choose(view([0, 3]), text) == 0


@pytest.mark.parametrize(
    ("loads", "imbalanced"),
    [
        ([100, 36], False),  # max − min = 64: not above the absolute threshold
        ([101, 36], True),  # 65 > 64 and 101 > 36 × 1.5 = 54
        ([195, 130], False),  # 65 > 64, but 195 is not above 130 × 1.5 = 195
        ([196, 130], True),  # 66 > 64 and 196 > 195
        ([300, 200], False),  # 100 > 64, but 300 = 200 × 1.5
        ([64, 0], False),  # 64 is not above 64, though 64 > 0 × 1.5
        ([65, 0], True),
        ([0, 130, 196], True),  # over all workers: max 196, min 0
    ],
)
def test_cache_aware_imbalance_needs_both_thresholds(loads: list[int], imbalanced: bool) -> None:
    policy = cache_aware(len(loads))
    busiest = loads.index(max(loads))
    policy.tree.insert("hello world", busiest)
    # the busiest worker holds the whole text: it wins unless the loads are imbalanced
    expected = loads.index(min(loads)) if imbalanced else busiest
    assert policy.imbalanced(loads) is imbalanced
    assert policy.choose(view(loads), "hello world") == expected


def test_cache_aware_least_loaded_is_the_first_of_equals() -> None:
    assert first_least([5, 2, 2]) == 1
    policy = cache_aware(3)
    assert policy.choose(view([90, 20, 20]), "no match here") == 1  # imbalanced: 70 > 64, 90 > 30
    assert policy.choose(view([9, 2, 2]), "nothing cached") == 1  # balanced, no match: least loaded


def test_cache_aware_inserts_the_text_under_the_chosen_worker_either_way() -> None:
    policy = cache_aware(2)
    assert policy.choose(view([100, 0]), "shared system prompt, question 1") == 1  # imbalanced
    assert policy.tree.prefix_match("shared system prompt, question 2") == (1, 31)
    # balanced now: 31 of 32 characters match worker 1, which wins though it has more in flight
    assert policy.choose(view([0, 5]), "shared system prompt, question 2") == 1


def test_the_router_counts_in_flight_requests_only_under_cache_aware() -> None:
    router = FleetRouter(RouterSettings("cache_aware"), 2)
    # no text matches another's first character: the least loaded each time, the first of equals
    assert [router.route(text) for text in ("alpha", "bravo", "charlie")] == [0, 1, 0]
    assert router.view.in_flight == [2, 1]
    router.answered(0)
    assert router.view.in_flight == [1, 1]
    rr = FleetRouter(RouterSettings("round_robin"), 2)
    rr.route(None)
    assert rr.view.in_flight == [0, 0]


def test_the_routers_periodic_jobs_run_on_their_intervals() -> None:
    p2 = FleetRouter(RouterSettings("power_of_two", poll_interval_secs=30), 2)
    polls = []
    while p2.next_periodic() <= 90:
        polls.append(p2.next_periodic())
        p2.run_periodic(lambda: [1, 2])
    assert polls == [0.0, 30.0, 60.0, 90.0] and p2.view.polled == [1, 2]  # the first poll at once
    ca = FleetRouter(RouterSettings("cache_aware", eviction_interval_secs=60), 2)
    assert ca.next_periodic() == 60.0  # the eviction thread sleeps first
    ca.run_periodic(lambda: [])
    assert ca.next_periodic() == 120.0
    off = FleetRouter(RouterSettings("cache_aware", eviction_interval_secs=0), 2)
    assert off.next_periodic() == float("inf")
    assert FleetRouter(RouterSettings("round_robin"), 2).next_periodic() == float("inf")


def test_the_first_load_poll_can_fall_anywhere_in_the_interval() -> None:
    p2 = FleetRouter(RouterSettings("power_of_two", poll_interval_secs=2, first_poll_s=0.5), 2)
    polls = []
    while p2.next_periodic() <= 5:
        polls.append(p2.next_periodic())
        p2.run_periodic(lambda: [4, 3])
    assert polls == [0.5, 2.5, 4.5] and p2.view.polled == [4, 3]
    assert p2.route(None) == 1  # the lower polled load, whichever worker is drawn first
    # a policy that polls nothing keeps no poll, whatever the phase
    assert FleetRouter(RouterSettings("round_robin", first_poll_s=0.5), 2).next_periodic() == float("inf")
    with pytest.raises(ValueError, match=r"first load poll must be at or after time 0, got -0\.1 s"):
        RouterSettings("power_of_two", first_poll_s=-0.1).check()

"""smg 1.13.0's power_of_two (`--router-impl smg`, fleet/smg_policy.py) in hand-made situations. The
scores are the ones smg 1.13.0 logged for the same /v1/loads snapshots (its debug line `power_of_two
selected … (score S …)`, docs/simulate.md); every expected value below is worked out by hand from the rule:

    (queued + running × 1024 + since_poll + unaccounted × 1024) / throughput + 0.15 × u / (1 − u)
"""

from __future__ import annotations

import pytest

from helpers import Scripted
from kvadmit.cli import main
from kvadmit.fleet.policies import RouterView
from kvadmit.fleet.router import FleetRouter, RouterSettings
from kvadmit.fleet.smg_policy import LeastLoadTunables, PolledLoad, SmgPowerOfTwo, expected_wait

T = LeastLoadTunables()


def load(
    uncached: int = 0, waiting: int = 0, running: int = 0, tput: float = 0.0, usage: float = 0.0
) -> PolledLoad:
    return PolledLoad(uncached, waiting, running, tput, usage)


def snap(
    uncached: int = 0, waiting: int = 0, running: int = 0, tput: float = 0.0, usage: float = 0.0
) -> dict:  # type: ignore[type-arg]
    return {"num_waiting_uncached_tokens": uncached, "num_waiting_reqs": waiting, "num_running_reqs": running,
            "gen_throughput": tput, "token_usage": usage}  # fmt: skip


# ----- the score -----------------------------------------------------------------------------------------


def test_expected_wait_matches_the_scores_smg_logged() -> None:
    # 3000 uncached + 4 running × 1024 = 7096 tokens / 500 tok/s = 14.192 s; 0.15 × 0.3 / 0.7 = 0.0642857…
    assert expected_wait(load(3000, 2, 4, 500.0, 0.3), 0, 0, 0, T) == pytest.approx(14.192 + 0.045 / 0.7)
    # 1 running × 1024 / 100 = 10.24 s; 0.15 × 0.1 / 0.9 = 0.016667 (smg: 10.2567)
    assert expected_wait(load(0, 0, 1, 100.0, 0.1), 0, 0, 0, T) == pytest.approx(10.24 + 0.015 / 0.9)


def test_the_queue_is_its_uncached_tokens_or_1024_per_waiting_request_when_it_reports_none() -> None:
    assert expected_wait(load(500, 3, 0, 100.0), 0, 0, 0, T) == 5.0  # 500 / 100
    assert expected_wait(load(0, 3, 0, 100.0), 0, 0, 0, T) == pytest.approx(30.72)  # 3 × 1024 / 100


def test_a_worker_with_no_throughput_yet_drains_at_2000_tokens_per_second() -> None:
    assert expected_wait(load(0, 0, 1, 0.0), 0, 0, 0, T) == 0.512  # 1024 / 2000
    assert expected_wait(load(), 0, 0, 0, T) == 0.0  # an idle worker that never decoded


def test_kv_pressure_alone_and_clamped_below_1() -> None:
    assert expected_wait(load(0, 0, 0, 100.0, 0.5), 0, 0, 0, T) == pytest.approx(0.15)  # 0.15 × 0.5 / 0.5
    assert expected_wait(load(0, 0, 0, 100.0, 1.0), 0, 0, 0, T) == pytest.approx(0.15 * 0.999 / 0.001)


def test_requests_sent_since_the_poll_and_requests_in_flight_the_snapshot_does_not_show() -> None:
    idle = load(0, 0, 0, 100.0)
    # 3 in flight, none sent since the poll, none shown: 3 × 1024 / 100 (smg: 30.72)
    assert expected_wait(idle, 0, 0, 3, T) == pytest.approx(30.72)
    # 3 in flight of which 1 was sent since the poll (credited 1024): 1024 + 2 × 1024, the same 30.72
    assert expected_wait(idle, 1024, 1, 3, T) == pytest.approx(30.72)
    # 3 in flight, the snapshot shows 1 running and 1 waiting: 1024 + 1024 + 1 × 1024 (smg: 30.72)
    assert expected_wait(load(0, 1, 1, 100.0), 0, 0, 3, T) == pytest.approx(30.72)
    # fewer in flight than shown (answers since the poll): nothing taken off (smg: 20.48)
    assert expected_wait(load(0, 1, 1, 100.0), 0, 0, 0, T) == pytest.approx(20.48)


# ----- the choice ----------------------------------------------------------------------------------------


def test_the_pair_is_drawn_as_sglang_router_draws_it_and_the_lower_wait_wins() -> None:
    policy = SmgPowerOfTwo(Scripted((3, 2), (2, 1)))  # i = 2, j = (2 + 1 + 1) mod 3 = 1
    policy.update_loads([snap(), snap(running=1, tput=100.0), snap(running=2, tput=100.0)])
    assert policy.choose(RouterView([0, 0, 0]), None) == 1  # 10.24 s against 20.48 s
    assert (policy.since_tokens, policy.since_requests) == ([0, 1024, 0], [0, 1, 0])


def test_a_tie_is_a_coin_toss_and_the_credit_tips_the_next_pick() -> None:
    both = [snap(uncached=1000, tput=100.0), snap(uncached=1000, tput=100.0)]
    policy = SmgPowerOfTwo(Scripted((2, 0), (1, 0), (2, 1), (2, 0), (1, 0)))
    policy.update_loads(both)
    assert policy.choose(RouterView([0, 0]), None) == 0  # 10 s each: the toss (1) keeps the first
    assert policy.choose(RouterView([1, 0]), None) == 1  # (1000 + 1024) / 100 = 20.24 s against 10 s
    policy.update_loads(both)  # a poll: the credits start again
    assert (policy.since_tokens, policy.since_requests) == ([0, 0], [0, 0])
    toss_second = SmgPowerOfTwo(Scripted((2, 0), (1, 0), (2, 0)))
    toss_second.update_loads(both)
    assert toss_second.choose(RouterView([0, 0]), None) == 1  # the toss (0) takes the second


def test_before_the_first_poll_the_shorter_queue_of_requests_in_flight_wins() -> None:
    policy = SmgPowerOfTwo(Scripted((2, 0), (1, 0)))
    assert policy.choose(RouterView([2, 1]), None) == 1


def test_requests_compares_requests_in_flight_first_and_the_wait_on_a_tie() -> None:
    loads = [snap(running=1, tput=100.0), snap(uncached=50, waiting=2, running=3, tput=1.0)]
    policy = SmgPowerOfTwo(Scripted((2, 0), (1, 0), (2, 0), (1, 0)), metric="requests")
    policy.update_loads(loads)
    assert policy.choose(RouterView([1, 0]), None) == 1  # 1 in flight against 0: the wait does not count
    # a tie: 10.24 s against (50 + 3 × 1024 + the credit 1024) / 1 = 4146 s
    assert policy.choose(RouterView([0, 0]), None) == 0
    expected = SmgPowerOfTwo(Scripted((2, 0), (1, 0)))
    expected.update_loads(loads)
    # expected_wait: the one in flight is the running one the snapshot shows, 1024 / 100 = 10.24 s
    assert expected.choose(RouterView([1, 0]), None) == 0


def test_least_requests_takes_the_fewest_in_flight_of_every_worker_ties_by_reservoir() -> None:
    idle = [snap(tput=100.0)] * 3
    policy = SmgPowerOfTwo(Scripted((2, 1)), metric="least_requests")  # no pair is drawn
    policy.update_loads(idle)
    # in flight 1, 0, 0: worker 0 is out; 1 and 2 tie at (0, 0 s): the second met keeps it with 1/2
    assert policy.choose(RouterView([1, 0, 0]), None) == 1
    assert policy.since_tokens == [0, 1024, 0]
    policy = SmgPowerOfTwo(Scripted((2, 0)), metric="least_requests")
    policy.update_loads(idle)
    assert policy.choose(RouterView([1, 0, 0]), None) == 2  # the draw (0) takes worker 2
    # a three-way tie: worker 1 replaces 0 with 1/2 (draw 1: no), worker 2 replaces it with 1/3 (draw 0)
    policy = SmgPowerOfTwo(Scripted((2, 1), (3, 0)), metric="least_requests")
    policy.update_loads(idle)
    assert policy.choose(RouterView([0, 0, 0]), None) == 2
    # the wait breaks a tie in flight (1 each): worker 1's request is not in its snapshot, 1024 / 100 =
    # 10.24 s; worker 2 shows 2 running, 2048 / 100 = 20.48 s
    policy = SmgPowerOfTwo(Scripted(), metric="least_requests")
    policy.update_loads([snap(tput=100.0), snap(tput=100.0), snap(running=2, tput=100.0)])
    assert policy.choose(RouterView([2, 1, 1]), None) == 1


def test_one_worker_takes_everything_without_a_draw() -> None:
    assert SmgPowerOfTwo(Scripted()).choose(RouterView([5]), None) == 0


# ----- the router and its flags ---------------------------------------------------------------------------


def test_the_smg_router_polls_snapshots_every_load_monitor_interval_and_counts_requests_in_flight() -> None:
    router = FleetRouter(RouterSettings("power_of_two", impl="smg", poll_interval_secs=10), 2)
    assert router.reads_snapshot and router.next_periodic() == 0.0
    router.run_periodic(lambda: [99, 0], lambda: [snap(running=4, tput=200.0), snap(tput=200.0)])
    assert router.next_periodic() == 10.0
    # 20.48 s against 0, then against 1024 / 200 = 5.12 s (the credit of the request just sent)
    assert [router.route(None) for _ in range(2)] == [1, 1]
    assert sum(router.view.in_flight) == 2
    assert not FleetRouter(RouterSettings("power_of_two"), 2).reads_snapshot  # sglang-router's /get_load


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (RouterSettings("cache_aware", impl="smg"), "smg 1.13.0's cache_aware is not modelled"),
        (RouterSettings("power_of_two", impl="smg", load_metric="tokens"), "must be one of expected_wait"),
        (RouterSettings("power_of_two", impl="smg", poll_interval_secs=0), "--load-monitor-interval must"),
        (RouterSettings("power_of_two", impl="nginx"), "unknown router 'nginx'"),
        (RouterSettings("power_of_two", impl="smg", least_load=LeastLoadTunables(0.15, 0.0)), "throughput"),
    ],
)
def test_settings_smg_does_not_have_are_refused(settings: RouterSettings, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings.check()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--router", "power_of_two", "--load-monitor-interval", "1"], "--load-monitor-interval is smg's"),
        (["--router", "power_of_two", "--power-of-two-load-metric", "requests"], "add --router-impl smg"),
        (["--router", "cache_aware", "--router-impl", "smg"], "cache_aware is not modelled"),
    ],
)
def test_bad_smg_flags_are_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    code = main(["simulate", "--max-total-tokens", "4096", "--num-prompts", "4", "--replicas", "2", *flags])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_simulate_behind_smg_serves_every_request_and_says_whose_router(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["simulate", "--max-total-tokens", "4096", "--num-prompts", "12", "--random-input-len", "64",
                 "--random-output-len", "16", "--request-rate", "20", "--decode-step-ms", "20",
                 "--replicas", "2", "--router", "power_of_two", "--router-impl", "smg",
                 "--load-monitor-interval", "1"])  # fmt: skip
    out, _ = capsys.readouterr()
    assert code == 0
    assert (
        "2 replicas behind smg 1.13.0, --policy power_of_two --power-of-two-load-metric expected_wait" in out
    )


# ----- what a simulated replica reports on /v1/loads ------------------------------------------------------


def test_a_replicas_snapshot_throughput_follows_the_decode_window_and_the_idle_pass() -> None:
    """One request decoding alone, 20 ms decode steps, a decode report every step (--decode-log-interval
    1): each window is 1 token / 0.02 s = 50 tok/s. Idle afterwards, the idle pass zeroes it (the running
    gauge still showed 1 request)."""
    from kvadmit.bench.workload import SimRequest, WorkloadSpec
    from kvadmit.config import ServerArgs
    from kvadmit.costmodel.costmodel import CostModel
    from kvadmit.fleet.replica import Replica
    from kvadmit.sim.run import SimConfig

    args = ServerArgs(max_total_tokens=4096, decode_log_interval=1, disable_overlap_schedule=True)
    cfg = SimConfig(args=args, workload=WorkloadSpec(num_prompts=1, vocab_size=257),
                    cost=CostModel.simple(decode_step_ms=20.0, prefill_tokens_per_s=1e6))  # fmt: skip
    replica = Replica(0, cfg, None, None, (), (), False)
    replica.watch_load()
    replica.deliver(0.0, SimRequest(0, 10, 8, 8, None, True, 0, tuple(range(10))), None, "r0", 0.0)
    for _ in range(4):  # the prefill, then 3 decode steps
        replica.step()
    assert replica.snapshot(replica.clock.now())["gen_throughput"] == 50.0
    while replica.step():
        pass
    assert replica.snapshot(replica.clock.now())["gen_throughput"] == 0.0

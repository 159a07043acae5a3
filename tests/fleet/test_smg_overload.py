"""smg 1.13.0's worker overload protection, on by default (its --help: a worker whose polled waiting
requests reach --worker-overload-waiting-requests 8, or whose token usage reaches
--worker-overload-token-usage 0.8, is left out of routing while another worker is under both): it
applies to round_robin too, which sglang-router 0.3.2 and kvadmit's simulated router do not do.

Two workers that run 4 requests at a time; worker 0 is kept busy with long requests sent straight to it
(4 running, the rest waiting), and n short requests go through smg's round_robin one at a time after the
router has polled that load. Round robin alone sends every other one to worker 0."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fleet_helpers import Proc, requests_counted, router_loads, running_router, wait_idle
from test_fleet_routers import Occupier, delta, send_one_by_one

N = 10


def split_with_worker_0_busy(
    workers: list[Proc], busy: int, extra: list[str], folder: Path, router: str = "smg"
) -> list[int]:
    with running_router(router, workers, "round_robin", folder, extra) as r:
        before = requests_counted(workers)
        with Occupier(workers[0], busy):
            for _ in range(50):  # the router polls loads every second (--load-monitor-interval 1)
                if router_loads(router, r.url)[workers[0].url] >= busy:
                    break
                time.sleep(0.2)
            time.sleep(2.5)  # two more polls: the overload flag is computed from a fresh report
            send_one_by_one(r.url, N, timeout=3)
            others = delta(before, requests_counted(workers))[1]
        wait_idle(workers)
    return [N - others, others]  # what worker 1 did not answer went to worker 0


@pytest.mark.parametrize("workers", [2], indirect=True)
@pytest.mark.parametrize(
    ("busy", "extra", "expected"),
    [
        (12, [], [0, N]),  # 8 waiting: at the threshold (inclusive), worker 0 is left out
        (12, ["--disable-worker-overload-protection"], [N // 2, N // 2]),
    ],
    ids=["8-waiting", "protection-off"],
)
def test_smg_round_robin_skips_a_worker_with_8_waiting_by_default(
    workers: list[Proc], busy: int, extra: list[str], expected: list[int], tmp_path: Path
) -> None:
    split = split_with_worker_0_busy(workers, busy, extra, tmp_path)
    print(f"smg round_robin, worker 0 holding {busy} (4 running): split {split}")
    assert split == expected


@pytest.mark.parametrize("workers", [2], indirect=True)
def test_sglang_router_round_robin_has_no_such_protection(workers: list[Proc], tmp_path: Path) -> None:
    assert split_with_worker_0_busy(workers, 12, [], tmp_path, "sglang-router") == [N // 2, N // 2]


@pytest.mark.parametrize("workers", [2], indirect=True)
def test_with_7_waiting_the_request_round_robin_deals_it_tips_it_to_8_and_it_is_left_out(
    workers: list[Proc], tmp_path: Path
) -> None:
    """Under the threshold worker 0 is still dealt a request; waiting behind the 7 (its client gives up
    after 3 s, more than the 1 s poll) it makes 8, and from the next poll worker 0 is left out: it gets
    at least one and fewer than round robin's half (measured: 1 of 10)."""
    to_0, to_1 = split_with_worker_0_busy(workers, 11, [], tmp_path)
    print(f"smg round_robin, worker 0 holding 11 (4 running): split {[to_0, to_1]}")
    assert 1 <= to_0 < N // 2

"""smg 1.13.0's power_of_two scores against kvadmit's model of them (fleet/smg_policy.py): two fake
workers (fake_loads_worker.py) answer chosen /v1/loads snapshots, smg polls them every second, and its
debug line `power_of_two selected URL (score S, …)` names the winner's score. Worker 1 is made hopeless
(10^7 queued tokens at 1 token/s), so every request goes to worker 0 and S is worker 0's score, which
must be the model's expected_wait for that snapshot to the 4 decimals smg prints."""

from __future__ import annotations

import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fleet_helpers import Proc, free_port, running_router, start, wait_until

from kvadmit.fleet.smg_policy import LeastLoadTunables, PolledLoad, expected_wait

HERE = Path(__file__).resolve().parent
SCORE = re.compile(r"power_of_two selected (\S+) \(score ([0-9.]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def snapshot(**fields: float) -> dict[str, float]:
    base = dict.fromkeys(("num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens",
                          "num_used_tokens", "token_usage", "gen_throughput"), 0)  # fmt: skip
    return {**base, "max_total_num_tokens": 20000, "max_running_requests": 4, **fields}


CASES = [
    snapshot(num_running_reqs=2, gen_throughput=100.0),
    snapshot(num_running_reqs=1),  # no throughput yet: 2000 tokens/s
    snapshot(num_waiting_reqs=3, gen_throughput=100.0),  # no uncached tokens: 1024 per waiting request
    snapshot(num_waiting_reqs=3, num_waiting_uncached_tokens=500, gen_throughput=100.0),
    snapshot(token_usage=0.2, num_used_tokens=10000, gen_throughput=100.0),
    snapshot(
        num_running_reqs=4,
        num_waiting_reqs=2,
        num_waiting_uncached_tokens=3000,
        gen_throughput=500.0,
        token_usage=0.3,
    ),
]


def fake_worker(folder: Path, k: int, snap: dict[str, float], hold_s: float = 0.0) -> tuple[Proc, Path]:
    path = folder / f"snapshot{k}.json"
    path.write_text(json.dumps(snap))
    port = free_port()
    proc = start([sys.executable, str(HERE / "fake_loads_worker.py"), str(port), str(path), str(hold_s)],
                 folder / f"fake{k}.log", f"http://127.0.0.1:{port}")  # fmt: skip
    wait_until(proc, lambda: httpx.get(f"{proc.url}/v1/models", timeout=2).status_code == 200, "fake worker")
    return proc, path


def test_smg_scores_a_snapshot_as_the_model_does(tmp_path: Path) -> None:
    hopeless = snapshot(num_waiting_uncached_tokens=10_000_000, gen_throughput=1.0)
    (w0, snap0), (w1, _) = fake_worker(tmp_path, 0, CASES[0]), fake_worker(tmp_path, 1, hopeless)
    try:
        with running_router("smg", [w0, w1], "power_of_two", tmp_path, ["--log-level", "debug"]) as router:
            for case in CASES:
                snap0.write_text(json.dumps(case))
                time.sleep(2.3)  # two polls: the snapshot is read and the since-poll credits are 0
                start_at = router.log.stat().st_size
                body = {"model": "simulated", "prompt": "hello", "max_tokens": 1}
                assert httpx.post(f"{router.url}/v1/completions", json=body, timeout=10).status_code == 200
                time.sleep(0.3)
                with router.log.open("rb") as f:
                    f.seek(start_at)
                    found = SCORE.findall(ANSI.sub("", f.read().decode(errors="replace")))
                assert len(found) == 1 and found[0][0] == w0.url, found
                model = expected_wait(PolledLoad.from_snapshot(case), 0, 0, 0, LeastLoadTunables())
                print(f"{case}: smg {found[0][1]}, model {model:.4f}")
                assert float(found[0][1]) == pytest.approx(model, abs=5e-5)
    finally:
        w0.stop()
        w1.stop()


@pytest.mark.parametrize(("metric", "slow_share"), [("requests", (9, 32)), ("least_requests", (0, 8))])
def test_requests_draws_a_pair_and_least_requests_looks_at_every_worker(
    metric: str, slow_share: tuple[int, int], tmp_path: Path
) -> None:
    """Three workers, the first two holding every request for 25 s, the third answering at once; 60
    requests 50 ms apart. By the router's requests in flight, once the slow two hold some: under
    `requests` the drawn pair is the slow two a third of the time and one of them gets the request
    (binomial: 20 of 60 expected, sd 3.7; measured 12 of 30 in a 30-request run), under `least_requests`
    the fast one gets it but for the early ties (measured 4 of 30). The bounds sit 3 sd out: the two
    metrics cannot pass each other's test."""
    idle = snapshot(gen_throughput=100.0)
    fakes = [fake_worker(tmp_path, k, idle, hold_s=25.0 if k < 2 else 0.0) for k in range(3)]
    workers = [proc for proc, _ in fakes]
    try:
        extra = ["--log-level", "debug", "--power-of-two-load-metric", metric]
        with running_router("smg", workers, "power_of_two", tmp_path, extra) as router:
            time.sleep(2.3)  # past the warm-up's poll: the credits are 0
            start_at = router.log.stat().st_size
            body = {"model": "simulated", "prompt": "hello", "max_tokens": 1}
            with ThreadPoolExecutor(60) as pool:
                for _ in range(60):
                    pool.submit(httpx.post, f"{router.url}/v1/completions", json=body, timeout=60)
                    time.sleep(0.05)
                time.sleep(0.5)
                with router.log.open("rb") as f:
                    f.seek(start_at)
                    picks = [url for url, _ in SCORE.findall(ANSI.sub("", f.read().decode(errors="replace")))]
                slow = sum(url != workers[2].url for url in picks)
                print(f"{metric}: {slow} of {len(picks)} to the slow workers")
                assert len(picks) == 60 and slow_share[0] <= slow <= slow_share[1]
                for proc in workers:  # the held requests are not waited for
                    proc.stop()
    finally:
        for proc in workers:
            proc.stop()

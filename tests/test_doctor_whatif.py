"""Issue 21: the doctor reconstructs the server and its workload from the log, checks that simulating the
reconstruction reproduces the log, and simulates its advice and the user's --what-if flags.

Expected values come from the logs (tests/data/logs/README.md: the q2 server's pool is 87,552 tokens; the
04 excerpt's largest #token is 87,505) or from the flags and workloads the round trip is generated with."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from kvadmit.bench.workload import WorkloadSpec, build_workload
from kvadmit.cli import main
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.doctor.diagnose import Inputs, diagnose
from kvadmit.doctor.prove import prove
from kvadmit.doctor.whatif import Scenario
from kvadmit.sim.run import SimConfig, SimResult, simulate

LOGS = Path(__file__).parent / "data" / "logs"
Q2_POOL = 87_552  # the README's KV pool of the q2 server (03, 04, 07 are excerpts of its log)
Q2 = {
    "03-sglang-q2-qwen3-4b-healthy-ramp.log": "healthy-queue",
    "04-sglang-q2-qwen3-4b-retraction-burst.log": "retraction-storm",
    "07-sglang-q2-qwen3-4b-queue-drain.log": "healthy-queue",
}


@pytest.mark.parametrize("name", sorted(Q2))
def test_real_logs_keep_their_verdict_and_gain_a_reconstruction(name: str) -> None:
    path = str(LOGS / name)
    verdict = diagnose(Inputs(log=path)).verdict
    assert verdict == Q2[name]
    proof = prove(path, verdict, [])
    rec = proof.reconstruction
    assert rec is not None
    lo, hi = rec.pool_range
    assert lo <= Q2_POOL <= hi  # the pool the README gives lies in what the log's usage allows
    assert abs(rec.pool.value - Q2_POOL) / Q2_POOL < 0.005
    assert rec.pool.confidence == "estimate"  # no start-up line in these excerpts
    assert proof.check and proof.check[0].metric == "verdict"
    assert proof.outcomes[0].scenario.source == "today"


def test_04_pool_never_below_the_largest_token_count_and_the_storm_is_reproduced() -> None:
    path = str(LOGS / "04-sglang-q2-qwen3-4b-retraction-burst.log")
    proof = prove(path, "retraction-storm", [])
    rec = proof.reconstruction
    assert rec is not None
    assert rec.pool_range[0] >= 87_505  # "#token: 87505, token usage: 1.00" at 16:06:17
    # 16 retraction lines in the 21 s the excerpt spans (16:06:04 to 16:06:24): 45.7 a minute.
    assert proof.real is not None
    assert proof.real.retractions_per_min == pytest.approx(16 * 60 / 21, rel=1e-6)
    assert proof.reproduced, [r.to_json() for r in proof.check]
    today, *advice = proof.outcomes
    assert today.verdict == "retraction-storm"
    labels = [o.scenario.label for o in advice]
    assert "--schedule-conservativeness 1.3" in labels
    # The cap advised is below the 66 running when the first retraction came (16:06:07).
    assert rec.running_at_first_retraction == 66
    cap = next(o for o in advice if o.scenario.label.startswith("--max-running-requests"))
    assert cap.scenario.overrides["max_running_requests"] < 66
    conservative = next(o for o in advice if o.scenario.label == "--schedule-conservativeness 1.3")
    assert conservative.stats.retractions_per_min < today.stats.retractions_per_min


def test_cli_what_if_in_text_json_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = str(LOGS / "04-sglang-q2-qwen3-4b-retraction-burst.log")
    html = tmp_path / "r.html"
    flags = ["--what-if", "--schedule-conservativeness 2.0"]
    assert main(["doctor", log, *flags, "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "Replay check" in out and "| --schedule-conservativeness 2.0" in out
    assert main(["doctor", log, *flags, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["what_if"]["what_if"]
    assert [r["source"] for r in rows].count("user") == 1
    assert data["what_if"]["reconstruction"]["pool"]["confidence"] == "estimate"
    page = html.read_text(encoding="utf-8")
    assert "Simulated timelines over the real one" in page and "--schedule-conservativeness 2.0" in page


@pytest.mark.parametrize("flags", ["--no-such-flag 3", "--schedule-conservativeness abc", ""])
def test_cli_bad_what_if_is_one_line_and_exit_2(flags: str, capsys: pytest.CaptureFixture[str]) -> None:
    log = str(LOGS / "04-sglang-q2-qwen3-4b-retraction-burst.log")
    assert main(["doctor", log, "--what-if", flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvadmit doctor: error: --what-if") and "\n" not in err


# --- round trip: logs made by the simulator from known flags and workloads ------------------------------

SPEC = WorkloadSpec(
    num_prompts=300, input_len=400, output_len=300, range_ratio=0.5, seed=3, ignore_eos=False,
    max_new_tokens=600, stop="full",
)  # fmt: skip
RATE = 4.0


def _simulated_log(tmp_path: Path, args: ServerArgs) -> tuple[str, SimResult]:
    cfg = SimConfig(args, SPEC, CostModel.simple(20.0, 20_000.0), request_rate=RATE, warmup_requests=0)
    lines: list[str] = []
    result = simulate(cfg, emit_log=lines.append)
    path = tmp_path / "sim.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path), result


def test_round_trip_recovers_pool_rate_and_lengths(tmp_path: Path) -> None:
    path, result = _simulated_log(tmp_path, ServerArgs(max_total_tokens=30_000))
    proof = prove(path, diagnose(Inputs(log=path)).verdict, [])
    rec = proof.reconstruction
    assert rec is not None
    assert rec.pool.value == 30_000 and rec.pool.confidence == "exact"
    reqs, _ = build_workload(SPEC)
    sends = sorted(o.start_time for o in result.outcomes)
    true_rate = (len(sends) - 1) / (sends[-1] - sends[0])  # the Poisson draw's own rate
    assert rec.arrivals.rate.value == pytest.approx(true_rate, rel=0.10)
    assert rec.prompt_len.value == pytest.approx(statistics.fmean(r.prompt_len for r in reqs), rel=0.10)
    true_out = statistics.fmean(r.true_output_len or 0 for r in reqs)
    assert rec.output_len.value == pytest.approx(true_out, rel=0.10)
    assert proof.reproduced


def test_round_trip_what_if_matches_simulating_the_changed_flag(tmp_path: Path) -> None:
    """TTFT p50 under a request cap of 16 (queueing dominates it, so it is stable): the what-if from the
    reconstruction against simulating the same workload with the cap."""
    path, _ = _simulated_log(tmp_path, ServerArgs(max_total_tokens=30_000))
    cap = Scenario("--max-running-requests 16", "user", {"max_running_requests": 16})
    proof = prove(path, diagnose(Inputs(log=path)).verdict, [cap])
    predicted = next(o for o in proof.outcomes if o.scenario is cap).ttft_p50_ms
    _, actual = _simulated_log(tmp_path, ServerArgs(max_total_tokens=30_000, max_running_requests=16))
    ttfts = sorted(1000 * o.ttft for o in actual.outcomes)
    assert predicted == pytest.approx(ttfts[len(ttfts) // 2], rel=0.10)


def test_an_idle_pool_held_by_the_cap_is_proved_by_doubling_the_cap(tmp_path: Path) -> None:
    """Capped at 8 running, 4 requests a second of about 300 output tokens at 20 ms a decode step: 8
    requests take about 300 × 20 ms = 6 s, 1.3 a second, so requests queue while 8 × (400 + 600) of the
    30,000-token pool is the most the running ones can reserve: an idle pool, #running-req flat at the cap.
    The cap explains it, so the reconstruction needs no oversized max_new_tokens to explain it, and the
    advice, the cap doubled, is simulated from the reconstruction: its TTFT p50 matches simulating the same
    workload with --max-running-requests 16."""
    path, _ = _simulated_log(tmp_path, ServerArgs(max_total_tokens=30_000, max_running_requests=8))
    found = diagnose(Inputs(log=path))
    assert found.verdict == "idle-pool-with-queue"
    assert found.lead.numbers["cause"] == "max-running-requests"
    proof = prove(path, found.verdict, [], "max-running-requests")
    rec = proof.reconstruction
    assert rec is not None and proof.reproduced
    assert rec.max_new_tokens.value <= 600  # not the room per running request ÷ the ratio's floor
    raised = next(
        o for o in proof.outcomes if o.scenario.label == "--max-running-requests 16 (twice the cap)"
    )
    assert raised.scenario.source == "advice"
    _, actual = _simulated_log(tmp_path, ServerArgs(max_total_tokens=30_000, max_running_requests=16))
    ttfts = sorted(1000 * o.ttft for o in actual.outcomes)
    assert raised.ttft_p50_ms == pytest.approx(ttfts[len(ttfts) // 2], rel=0.10)
    today = proof.outcomes[0]
    assert today.ttft_p50_ms is not None and raised.ttft_p50_ms < today.ttft_p50_ms

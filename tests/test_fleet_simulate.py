"""`kvadmit simulate --replicas N --router POLICY` (and `--dp-size`): one replica is plain `simulate`
byte for byte; round robin splits exactly; log lines carry SGLang's DP rank tags; bad fleet flags are
one line and exit status 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvadmit.cli import main

BASE = ["simulate", "--max-total-tokens", "4096", "--num-prompts", "9", "--random-input-len", "256",
        "--random-output-len", "64", "--random-range-ratio", "1", "--max-concurrency", "4",
        "--decode-step-ms", "20"]  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], *extra: str, tmp: Path | None = None) -> tuple[int, str, str]:
    argv = [*BASE, *extra]
    if tmp is not None:
        argv += ["--trace-requests", str(tmp / "requests.jsonl"), "--trace-steps", str(tmp / "steps.jsonl")]
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_one_replica_behind_the_router_is_plain_simulate_byte_for_byte(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "fleet").mkdir()
    code, plain, _ = run(capsys, tmp=tmp_path / "plain")
    assert code == 0
    for policy in ("round_robin", "random", "power_of_two", "cache_aware"):
        code, fleet, _ = run(capsys, "--replicas", "1", "--router", policy, tmp=tmp_path / "fleet")
        assert code == 0
        assert fleet == plain, policy
        for name in ("requests.jsonl", "steps.jsonl"):
            assert (tmp_path / "fleet" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    assert "Decode batch" in plain and "Successful requests:                     9" in plain


RETRACTING = ["simulate", "--max-total-tokens", "2000", "--num-prompts", "100", "--random-input-len", "32",
              "--random-output-len", "512", "--max-new-tokens", "512", "--schedule-conservativeness", "0.3",
              "--disable-ignore-eos", "--decode-step-ms", "20", "--decode-log-interval", "1"]  # fmt: skip


LOADS = [["--request-rate", "100"], ["--request-rate", "100", "--request-latency-ms", "7"],
         ["--max-concurrency", "6", "--warmup-requests", "3"]]  # fmt: skip


@pytest.mark.parametrize("load", LOADS)
def test_one_replica_is_plain_simulate_with_retractions_latency_and_rates(
    capsys: pytest.CaptureFixture[str], load: list[str]
) -> None:
    assert main([*RETRACTING, *load]) == 0
    plain = capsys.readouterr().out
    assert main([*RETRACTING, *load, "--replicas", "1", "--router", "power_of_two"]) == 0
    assert capsys.readouterr().out == plain
    assert "KV cache pool is full. Retract requests." in plain or load[0] == "--max-concurrency"


def test_two_replicas_round_robin_split_the_requests_exactly(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "--replicas", "2", "--router", "round_robin", tmp=tmp_path)
    assert code == 0
    # the warm-up request goes to DP0, then req-0 to DP1, req-1 to DP0, …: 4 and 5 of the 9
    trace = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [(r["rid"], r["replica"]) for r in trace] == [(f"req-{i}", (i + 1) % 2) for i in range(9)]
    assert re.search(r"\| DP0 \| 4 \| \d+ \| \d+ \|", out) and re.search(r"\| DP1 \| 5 \| \d+ \| \d+ \|", out)
    assert "Successful requests:                     9" in out
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert {s["replica"] for s in steps} == {0, 1}


def test_without_a_warm_up_round_robin_starts_at_replica_0(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, _ = run(
        capsys, "--replicas", "3", "--router", "round_robin", "--warmup-requests", "0", tmp=tmp_path
    )
    assert code == 0
    trace = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [r["replica"] for r in trace] == [0, 1, 2, 0, 1, 2, 0, 1, 2]


def test_each_replicas_log_lines_carry_its_dp_rank_tag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--replicas", "2", "--router", "round_robin")
    assert code == 0
    logs = [line for line in out.splitlines() if line.startswith("[2026-")]
    tags = [re.match(r"\[2026-01-01 \d\d:\d\d:\d\d (DP\d)\] ", line) for line in logs]
    assert all(tags), logs
    starts = [line[20:25] for line in logs if "max_total_num_tokens=4096" in line]
    assert starts == [" DP0]", " DP1]"]
    assert {m.group(1) for m in tags if m} == {"DP0", "DP1"}


def test_dp_size_round_robin_is_the_same_as_two_replicas_behind_round_robin(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, replicas, _ = run(capsys, "--replicas", "2", "--router", "round_robin")
    code, dp, _ = run(capsys, "--dp-size", "2")
    assert code == 0
    assert "\n--dp-size 2, --load-balance-method round_robin:\n" in dp
    assert "\n2 replicas behind the router, --policy round_robin:\n" in replicas
    same = dp.replace("--dp-size 2, --load-balance-method round_robin", "")
    assert same == replicas.replace("2 replicas behind the router, --policy round_robin", "")
    _, dp_rr, _ = run(capsys, "--dp-size", "2", "--load-balance-method", "round_robin")
    assert dp_rr == dp


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--dp-size", "2", "--load-balance-method", "total_tokens"],
            "--load-balance-method total_tokens is not",
        ),
        (["--dp-size", "2", "--load-balance-method", "follow_bootstrap_room"], "bootstrap room"),
        (["--dp-size", "2", "--replicas", "2"], "give one or the other"),
        (["--replicas", "0"], "--replicas must be ≥ 1, got 0"),
        (["--replicas", "2", "--cache-threshold", "1.5"], "--cache-threshold must be in [0, 1], got 1.5"),
        (["--replicas", "2", "--worker-startup-check-interval", "0"], "--worker-startup-check-interval must"),
        (["--dp-size", "0"], "--dp-size must be ≥ 1, got 0"),
    ],
)
def test_bad_fleet_flags_are_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    code, out, err = run(capsys, *flags)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvadmit simulate: error: ") and message in err, err


def test_every_request_is_served_once_under_every_policy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for policy in ("random", "power_of_two", "cache_aware"):
        code, out, _ = run(capsys, "--replicas", "3", "--router", policy, tmp=tmp_path)
        assert code == 0
        counts = [int(m) for m in re.findall(r"\| DP\d \| (\d+) \|", out)]
        assert len(counts) == 3 and sum(counts) == 9, (policy, out)
        trace = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
        assert [sum(r["replica"] == k for r in trace) for k in range(3)] == counts
        assert all(r["success"] for r in trace)

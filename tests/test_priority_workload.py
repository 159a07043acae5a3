"""--priority-mix: service tiers in `simulate`, `sweep` and `bench` workloads (docs/sglang-rules.md §13)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from kvadmit.bench import run as bench_run
from kvadmit.bench.metrics import RequestOutcome
from kvadmit.bench.priority_classes import render_priority_classes
from kvadmit.bench.workload import WorkloadSpec, build_workload, draw_priorities, parse_priority_mix
from kvadmit.cli import main
from server_helpers import RunningServer, running_server, write_cost_model


def test_the_mix_reads_priority_weight_pairs() -> None:
    assert parse_priority_mix("0:0.8,10:0.2") == ((0, 0.8), (10, 0.2))
    assert parse_priority_mix("-3:2, 7") == ((-3, 2.0), (7, 1.0))
    for bad, says in [
        ("high:1", "each entry is PRIORITY:WEIGHT"),
        ("0:x", "each entry is PRIORITY:WEIGHT"),
        ("0:0", "weights must be positive"),
        ("0:-1", "weights must be positive"),
        ("1:1,1:2", "priority 1 is listed twice"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse_priority_mix(bad)


def test_priorities_come_from_a_generator_of_their_own() -> None:
    plain, _ = build_workload(WorkloadSpec(num_prompts=2000, seed=3))
    mixed, _ = build_workload(WorkloadSpec(num_prompts=2000, seed=3, priority_mix=((0, 3.0), (10, 1.0))))
    # the lengths and prompts are those of the same workload without a mix
    strip = [(r.prompt_len, r.output_len, r.offset, r.true_output_len) for r in plain]
    assert strip == [(r.prompt_len, r.output_len, r.offset, r.true_output_len) for r in mixed]
    assert all(r.priority is None for r in plain)
    counts = Counter(r.priority for r in mixed)
    assert set(counts) == {0, 10}
    assert 0.70 < counts[0] / 2000 < 0.80  # weight 3 of 4 (500 expected for 10: ± 4.5 σ)
    assert draw_priorities(((5, 1.0),), 4, 0) == [5, 5, 5, 5]
    assert draw_priorities(((0, 3.0), (10, 1.0)), 50, 3) == draw_priorities(((0, 0.75), (10, 0.25)), 50, 3)


def test_the_block_lists_each_priority_most_urgent_first() -> None:
    outcomes = [
        RequestOutcome(prompt_len=1, success=True, ttft=0.010, latency=0.100, priority=0),
        RequestOutcome(prompt_len=1, success=True, ttft=0.030, latency=0.300, priority=0),
        RequestOutcome(prompt_len=1, success=True, ttft=0.002, latency=0.020, priority=10),
        RequestOutcome(prompt_len=1, success=False, priority=10),
    ]
    block = render_priority_classes(outcomes)
    assert block is not None
    rows = [line.split() for line in block.splitlines()[2:-1]]
    # priority 0: TTFT p50 of 10 and 30 ms = 20, p99 = 10 + 0.99 × 20 = 29.8; E2E 200 and 298
    assert rows == [
        ["10", "1", "2.00", "2.00", "20.00", "20.00"],
        ["0", "2", "20.00", "29.80", "200.00", "298.00"],
    ]
    assert render_priority_classes([RequestOutcome(prompt_len=1)]) is None


def test_simulate_with_priority_scheduling_serves_the_urgent_tier_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--max-total-tokens", "20000", "--max-running-requests", "16", "--num-prompts", "200",
            "--random-input-len", "512", "--random-output-len", "256", "--random-range-ratio", "0.5",
            "--request-rate", "8", "--priority-mix", "0:0.8,20:0.2", "--quiet"]  # fmt: skip

    def ttft_p50() -> dict[str, float]:
        out = capsys.readouterr().out
        lines = out[out.index("By priority") :].splitlines()[2:-1]
        return {row.split()[0]: float(row.split()[2]) for row in lines}

    assert main(argv) == 0
    off = ttft_p50()
    assert main([*argv, "--enable-priority-scheduling"]) == 0
    on = ttft_p50()
    assert set(on) == set(off) == {"0", "20"}
    assert on["20"] < off["20"] / 10  # the urgent tier no longer waits behind the queue
    assert on["0"] > off["0"]


def test_a_bad_mix_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--max-total-tokens", "2000", "--priority-mix", "0:zero"])
    assert e.value.code == 2
    assert "--priority-mix '0:zero': each entry is PRIORITY:WEIGHT" in capsys.readouterr().err


@pytest.fixture()
def sim(tmp_path: Any) -> Iterator[tuple[RunningServer, list[tuple[str, Any]]]]:
    seen: list[tuple[str, Any]] = []
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=1.0)
    with running_server(["--simulate", cost, "--enable-priority-scheduling"], seen) as s:
        yield s, seen


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai-chat"])
def test_bench_sends_each_request_its_priority(
    backend: str, sim: tuple[RunningServer, list[tuple[str, Any]]], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(bench_run, "PAUSE_AFTER_WARMUP_S", 0.0)
    srv, seen = sim
    argv = ["bench", "--base-url", srv.url, "--disable-tqdm", "--backend", backend, "--dataset-name",
            "random-ids", "--num-prompts", "40", "--random-input-len", "20", "--random-output-len", "4",
            "--seed", "5", "--priority-mix", "1:1,9:1"]  # fmt: skip
    assert main(argv) == 0
    sent = [body.get("priority") for _, body in seen]
    expected = draw_priorities(((1, 1.0), (9, 1.0)), 40, 5)
    assert sent[0] == expected[0]  # the warm-up: the first prompt
    assert sorted(sent[1:]) == sorted(expected)
    out = capsys.readouterr().out
    assert "By priority" in out and Counter(expected)[9] > 0

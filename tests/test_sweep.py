"""`kvadmit sweep`: a grid of simulations on all cores, its table, CSV and SVG, and the largest request
rate that meets a target."""

from __future__ import annotations

import csv
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.sim.rate_search import Target, search_max_rate
from kvadmit.sim.run import SimConfig
from kvadmit.sim.svgplot import nice_ticks
from kvadmit.sim.sweep import SweepPoint, run_point, run_points

SMALL = SimConfig(
    args=ServerArgs(max_total_tokens=20_000),
    workload=WorkloadSpec(num_prompts=150, input_len=256, output_len=256, range_ratio=0.5, ignore_eos=False),
    cost=CostModel.simple(decode_step_ms=15, prefill_tokens_per_s=20_000),
)


def test_points_in_worker_processes_give_what_one_process_gives() -> None:
    points = [SweepPoint({"c": c}, SimConfig(**{**{f: getattr(SMALL, f) for f in SMALL.__slots__},
                                                "max_concurrency": c})) for c in (4, 16, 64)]  # fmt: skip
    parallel = run_points(points, workers=2)
    serial = [run_point(p) for p in points]
    strip = [{**vars_of(r), "wall_s": 0} for r in parallel]
    assert strip == [{**vars_of(r), "wall_s": 0} for r in serial]
    # More concurrency, more throughput and a fuller pool on this light load.
    assert [r.output_throughput for r in parallel] == sorted(r.output_throughput for r in parallel)


def vars_of(r: object) -> dict[str, object]:
    return {f: getattr(r, f) for f in r.__slots__}  # type: ignore[attr-defined]


def test_the_queue_time_is_from_sending_to_the_first_prefill() -> None:
    # One request at a time: nothing ever waits in the queue, and TTFT is just the prefill.
    # (the non-overlap loop: under the overlap loop the next request also waits for the decode step
    # that was launched before the last one's end was known)
    serial = ServerArgs(max_total_tokens=20_000, disable_overlap_schedule=True)
    one = run_point(SweepPoint({}, SimConfig(**{**{f: getattr(SMALL, f) for f in SMALL.__slots__},
                                                "max_concurrency": 1, "args": serial})))  # fmt: skip
    assert one.queue_mean_ms == 0.0 and one.queue_p99_ms == 0.0
    assert one.retractions == 0 and one.running_mean == 1.0


def test_the_rate_search_brackets_the_target() -> None:
    target = Target(ttft_ms=500, statistic="p99")
    found = search_max_rate(SMALL, target, rel_tol=0.05)
    assert found.best_rate is not None
    best = next(p for p in found.probes if p.rate == found.best_rate)
    assert best.meets and best.ttft_ms <= 500
    # Some rate within 5% above it was tried and failed.
    assert any(
        not p.meets and found.best_rate < p.rate <= found.best_rate * 1.05 + 1e-9 for p in found.probes
    )


def test_nice_ticks() -> None:
    assert nice_ticks(97) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0.37) == [0, 0.1, 0.2, 0.30000000000000004, 0.4]


def test_the_cli_sweeps_a_grid_and_writes_csv_and_svg(tmp_path: Path) -> None:
    out_csv, out_svg = tmp_path / "s.csv", tmp_path / "s.svg"
    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "sweep", "--max-total-tokens", "20000", "--num-prompts", "100",
         "--random-input-len", "256", "--random-output-len", "256", "--disable-ignore-eos",
         "--schedule-conservativeness", "0.3,1.3", "--max-concurrency", "8,32", "--workers", "2",
         "--csv", str(out_csv), "--svg", str(out_svg)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    table = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| conservativeness | concurrency | TTFT p50 ms | TTFT p99 ms |")
    assert [row.split(" | ")[:2] for row in table[2:]] == [
        ["| 0.3", "8"], ["| 0.3", "32"], ["| 1.3", "8"], ["| 1.3", "32"]]  # fmt: skip
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 4 and all(int(r["completed"]) == 100 for r in rows)
    svg = ET.parse(out_svg).getroot()
    assert svg.tag.endswith("svg") and len(svg.findall(".//{http://www.w3.org/2000/svg}polyline")) == 6 * 2


def test_the_cli_searches_the_largest_rate_per_setting() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "sweep", "--max-total-tokens", "20000", "--num-prompts", "60",
         "--random-input-len", "128", "--random-output-len", "64", "--admission-policy", "sglang,optimistic",
         "--search-max-rate", "--target-ttft-ms", "300", "--rate-tolerance", "0.1", "--workers", "2"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "largest request rate meeting TTFT p99 ≤ 300 ms" in run.stdout
    rows = [line for line in run.stdout.splitlines() if line.startswith("| sglang") or line.startswith(
        "| optimistic")]  # fmt: skip
    assert len(rows) == 2 and all("none" not in row for row in rows)

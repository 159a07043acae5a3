"""`kvadmit sweep --ray`: the same points as tasks on a Ray cluster (here a private local instance) give
what worker processes give; Ray missing, a bad address or an unreachable cluster is one line, status 2."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import ray  # a dev dependency: where it is missing these tests fail, they do not skip

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.cli import main
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.sim.run import SimConfig
from kvadmit.sim.sweep import PointResult, SweepPoint, run_point, run_points

GRID = ["sweep", "--max-total-tokens", "8000", "--num-prompts", "200", "--random-input-len", "256",
        "--random-output-len", "256", "--disable-ignore-eos", "--schedule-conservativeness", "0.3,1.3",
        "--max-concurrency", "8,64"]  # fmt: skip
SEARCH = ["sweep", "--max-total-tokens", "8000", "--num-prompts", "60", "--random-input-len", "128",
          "--random-output-len", "64", "--admission-policy", "sglang,optimistic", "--search-max-rate",
          "--target-ttft-ms", "300", "--rate-tolerance", "0.1"]  # fmt: skip
SMALL = SimConfig(
    args=ServerArgs(max_total_tokens=8_000),
    workload=WorkloadSpec(num_prompts=200, input_len=256, output_len=256, range_ratio=0.5, ignore_eos=False),
    cost=CostModel.simple(decode_step_ms=15, prefill_tokens_per_s=20_000),
)
CPUS = 2


def _kvadmit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvadmit", *args], capture_output=True, text=True, timeout=120, check=False
    )


def _rows(stdout: str, drop_last: bool) -> list[list[str]]:
    """The table's rows, cell by cell; the grid's last column (wall s) differs from run to run."""
    rows = [line.strip("| ").split(" | ") for line in stdout.splitlines() if line.startswith("| ")]
    return [row[:-1] if drop_last else row for row in rows]


def test_a_sweep_on_a_local_ray_instance_gives_the_table_of_one_process() -> None:
    # A fresh process: --ray local starts its own Ray instance, runs the points there and shuts it down.
    on_ray = _kvadmit(*GRID, "--ray", "local")
    assert on_ray.returncode == 0, on_ray.stderr
    assert "Traceback" not in on_ray.stderr
    local = _kvadmit(*GRID, "--workers", "1")
    assert local.returncode == 0, local.stderr
    rows = _rows(on_ray.stdout, drop_last=True)
    assert len(rows) == 2 + 4 and rows == _rows(local.stdout, drop_last=True)
    assert rows[0][-1] == "running"  # only the wall-clock column was left out
    assert re.search(r"\n4 points, on a local Ray instance \(\d+ CPUs\), [\d.]+ s wall", on_ray.stdout)


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    """One local Ray instance for the tests below: ray_map uses a connection it finds and leaves it open."""
    ray.init(
        address="local",
        num_cpus=CPUS,
        log_to_driver=False,
        include_dashboard=False,
        logging_level=logging.WARNING,
    )
    yield
    ray.shutdown()


def _fields(r: PointResult) -> dict[str, object]:
    return {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "wall_s"}


def test_points_as_ray_tasks_equal_points_in_one_process(ray_instance: None) -> None:
    points = [SweepPoint({"c": c}, dataclasses.replace(SMALL, max_concurrency=c)) for c in (4, 16, 64, 128)]
    cpus: list[int] = []
    on_ray = run_points(points, ray_address="local", on_ray_connect=cpus.append)
    assert [_fields(r) for r in on_ray] == [_fields(run_point(p)) for p in points]
    assert cpus == [CPUS]
    assert ray.is_initialized()  # not ours to shut down


def test_the_rate_search_runs_on_ray_too(ray_instance: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SEARCH, "--ray", "local"]) == 0
    on_ray = capsys.readouterr().out
    assert main([*SEARCH, "--workers", "1"]) == 0
    local = capsys.readouterr().out
    rows = _rows(on_ray, drop_last=False)
    assert len(rows) == 2 + 2 and rows == _rows(local, drop_last=False)
    assert f"\n2 searches, on a local Ray instance ({CPUS} CPUs), " in on_ray


def test_an_unreachable_cluster_is_one_line_and_status_2() -> None:
    started = time.monotonic()
    run = _kvadmit(*GRID, "--ray", "127.0.0.1:1")
    assert time.monotonic() - started < 60
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith(
        "kvadmit sweep: error: --ray: cannot connect to the Ray cluster at 127.0.0.1:1"
    )
    assert run.stdout == ""


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ray", "head-node"], "'head-node' is not a Ray address: give auto, local, HOST:PORT"),
        (["--ray", "ray://head:port"], "'ray://head:port' is not a Ray address"),
        (["--ray", " "], "--ray needs an address"),
        (["--ray", "local", "--workers", "2"], "give one or the other"),
    ],
)
def test_bad_ray_flags_are_one_line(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*GRID, *flags]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_without_ray_installed_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    assert main([*GRID, "--ray", "local"]) == 2
    err = capsys.readouterr().err
    assert err == "kvadmit sweep: error: --ray: Ray is not installed: pip install 'kvadmit[ray]'\n"

"""Fleet fixtures: four `kvadmit serve --simulate` workers shared by the router tests (each test counts
only what it sent: deltas of the workers' counters, after waiting for them to be idle)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_helpers import Proc, start_worker, wait_idle, wait_worker

from server_helpers import write_cost_model

DECODE_MS = 5.0  # one decode step of every simulated worker
MAX_RUNNING = 4  # so a few long requests make a queue, which is what smg's power_of_two weighs
# The equal workers of the even-split test (test_fleet_routers.py, PER_WORKER_CLIENTS): a slower GPU, so a
# request lasts seconds, the router's one-second polls see each worker's queue, and the fleet's request
# rate (hence the CPU the client, router and HTTP sides spend) is a quarter of the 5 ms fleet's
STEADY_DECODE_MS = 20.0


@pytest.fixture(scope="session")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet")


def fleet_of_four(folder: Path, decode_ms: float) -> Iterator[list[Proc]]:
    cost = write_cost_model(folder / f"cost-{decode_ms:g}ms.json", decode_ms=decode_ms)
    extra = ["--max-running-requests", str(MAX_RUNNING)]
    workers = [start_worker(cost, folder, extra) for _ in range(4)]
    try:
        for w in workers:
            wait_worker(w)
        yield workers
    finally:
        for w in workers:
            w.stop()


@pytest.fixture(scope="session")
def four_workers(fleet_dir: Path) -> Iterator[list[Proc]]:
    yield from fleet_of_four(fleet_dir, DECODE_MS)


@pytest.fixture(scope="session")
def four_steady_workers(fleet_dir: Path) -> Iterator[list[Proc]]:
    yield from fleet_of_four(fleet_dir, STEADY_DECODE_MS)


@pytest.fixture
def workers(request: pytest.FixtureRequest, four_workers: list[Proc]) -> list[Proc]:
    """The first `request.param` of the four, idle."""
    chosen = four_workers[: request.param]
    wait_idle(four_workers)
    return chosen


@pytest.fixture
def steady_workers(request: pytest.FixtureRequest, four_steady_workers: list[Proc]) -> list[Proc]:
    """The first `request.param` of the four 20 ms workers, idle."""
    chosen = four_steady_workers[: request.param]
    wait_idle(four_steady_workers)
    return chosen

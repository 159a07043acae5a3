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


@pytest.fixture(scope="session")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet")


@pytest.fixture(scope="session")
def four_workers(fleet_dir: Path) -> Iterator[list[Proc]]:
    cost = write_cost_model(fleet_dir / "cost.json", decode_ms=DECODE_MS)
    extra = ["--max-running-requests", str(MAX_RUNNING)]
    workers = [start_worker(cost, fleet_dir, extra) for _ in range(4)]
    try:
        for w in workers:
            wait_worker(w)
        yield workers
    finally:
        for w in workers:
            w.stop()


@pytest.fixture
def workers(request: pytest.FixtureRequest, four_workers: list[Proc]) -> list[Proc]:
    """The first `request.param` of the four, idle."""
    chosen = four_workers[: request.param]
    wait_idle(four_workers)
    return chosen

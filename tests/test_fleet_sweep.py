"""`kvadmit sweep` over fleets: --replicas and --router lists, and --search-min-replicas (the fewest
replicas meeting a target at a given rate)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvadmit.cli import main
from kvadmit.fleet.replica_search import search_min_replicas
from kvadmit.sim.rate_search import Target

BASE = ["sweep", "--max-total-tokens", "20000", "--num-prompts", "60", "--random-input-len", "256",
        "--random-output-len", "64", "--decode-step-ms", "20", "--workers", "1"]  # fmt: skip


@dataclass(frozen=True)
class FakeFleet:
    """A fleet whose TTFT p99 is 1000 / replicas ms (every request succeeds)."""

    replicas: int = 1

    def simulate(self, cfg: object, watch_steps: tuple[object, ...] = ()) -> object:
        metrics = SimpleNamespace(ttft_ms={"p99": 1000 / self.replicas}, tpot_ms={"p99": 5.0}, completed=1)
        return SimpleNamespace(metrics=metrics, outcomes=[None])


def test_the_search_doubles_then_bisects_to_the_fewest_replicas() -> None:
    # 1000 / n ≤ 150 first holds at n = 7: 1, 2, 4 fail, 8 meets, then 6 fails and 7 meets
    found = search_min_replicas(None, FakeFleet(), Target(ttft_ms=150))  # type: ignore[arg-type]
    assert found.fewest == 7
    assert [(p.replicas, p.meets) for p in found.probes] == [
        (1, False), (2, False), (4, False), (8, True), (6, False), (7, True)]  # fmt: skip
    assert found.probes[-1].ttft_ms == pytest.approx(1000 / 7)


def test_the_search_stops_at_the_most_replicas_allowed() -> None:
    found = search_min_replicas(None, FakeFleet(), Target(ttft_ms=10), highest=12)  # type: ignore[arg-type]
    assert found.fewest is None
    assert [p.replicas for p in found.probes] == [1, 2, 4, 8, 12]
    one = search_min_replicas(None, FakeFleet(), Target(ttft_ms=1000))  # type: ignore[arg-type]
    assert one.fewest == 1 and len(one.probes) == 1


def test_sweep_spans_replicas_and_routers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fleet_csv, plain_csv = tmp_path / "fleet.csv", tmp_path / "plain.csv"
    argv = [*BASE, "--replicas", "1,2", "--router", "round_robin,cache_aware", "--request-rate", "50",
            "--csv", str(fleet_csv)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| replicas | router | rate | TTFT p50 ms |")
    assert [row.split(" | ")[:3] for row in table[2:]] == [
        ["| 1", "round_robin", "50"], ["| 1", "cache_aware", "50"],
        ["| 2", "round_robin", "50"], ["| 2", "cache_aware", "50"]]  # fmt: skip
    assert main([*BASE, "--request-rate", "50", "--csv", str(plain_csv)]) == 0
    capsys.readouterr()
    fleet_rows = list(csv.DictReader(fleet_csv.open()))
    plain = next(csv.DictReader(plain_csv.open()))
    metrics = ("ttft_p50_ms", "ttft_p99_ms", "tpot_mean_ms", "output_throughput", "kv_usage_mean")
    for row in fleet_rows[:2]:  # one replica behind either router is the plain server
        assert [row[m] for m in metrics] == [plain[m] for m in metrics]
    assert all(int(r["completed"]) == 60 for r in fleet_rows)
    assert float(fleet_rows[2]["ttft_p99_ms"]) < float(plain["ttft_p99_ms"])  # two replicas queue less


def test_the_cli_finds_the_fewest_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*BASE, "--request-rate", "60", "--router", "round_robin,power_of_two", "--search-min-replicas",
            "--target-ttft-ms", "100"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fewest replicas meeting TTFT p99 ≤ 100 ms at 60 req/s (60 requests per probe)" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| round_robin", "| power"))]
    assert len(rows) == 2
    for row in rows:
        fewest, probes = int(row[1]), row[4].rstrip(" |").split()
        assert f"{fewest}✓" in probes and float(row[2].replace(",", "")) <= 100
        if fewest > 1:
            assert f"{fewest - 1}✗" in probes  # the count below it was seen to fail


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--search-min-replicas", "--target-ttft-ms", "100"], "needs one finite --request-rate"),
        (["--search-min-replicas", "--request-rate", "5"], "needs --target-ttft-ms and/or"),
        (
            ["--search-min-replicas", "--request-rate", "5", "--target-ttft-ms", "9", "--replicas", "2"],
            "searches --replicas itself",
        ),
        (["--search-min-replicas", "--search-max-rate", "--target-ttft-ms", "9"], "one search at a time"),
    ],
)
def test_bad_search_flags_are_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert main([*BASE, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err

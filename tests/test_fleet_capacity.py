"""`kvadmit capacity --replicas N`: each replica's answer, and N times it for the fleet."""

from __future__ import annotations

import json

import pytest

from kvadmit.cli import main


def test_four_replicas_of_39_run_156(capsys: pytest.CaptureFixture[str]) -> None:
    # one replica: 39 × (512 + 512) = 39,936 ≤ 40,000 < 40 × 1,024 = 40,960 (tests/test_capacity_cli.py
    # checks the per-replica reasoning); four replicas, each its own pool: 4 × 39 and 4 × 8
    argv = ["capacity", "--max-total-tokens", "40000", "--input-len", "512", "--output-len", "512"]
    assert main([*argv, "--replicas", "4", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["running_at_once"] == 39 and answer["first_pass_admitted"] == 8
    assert answer["replicas"] == 4
    assert answer["fleet_running_at_once"] == 156 and answer["fleet_first_pass_admitted"] == 32
    assert main([*argv, "--replicas", "4"]) == 0
    assert "Over 4 replicas, each with a pool of its own: 4 × 39 = 156 run at once" in capsys.readouterr().out
    assert main(argv) == 0
    assert "replicas" not in capsys.readouterr().out


def test_zero_replicas_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["capacity", "--max-total-tokens", "40000", "--input-len", "512", "--output-len", "512"]
    assert main([*argv, "--replicas", "0"]) == 2
    assert capsys.readouterr().err == "kvadmit capacity: error: --replicas must be ≥ 1, got 0\n"

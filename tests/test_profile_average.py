"""`kvadmit profile --average`: the mean of several profiles of one machine (costmodel/profile_average.py).
The expected numbers are worked out by hand from the rule: the mean of the numbers predicts the mean of
the predictions, so tokens/s is averaged as ms per token."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvadmit.costmodel.costmodel import CostModel, DecodeCost, DecodeTable, PrefillCost
from kvadmit.costmodel.profile_average import ProfileAverageError, average_profiles
from kvadmit.observe.loglines import DECODE

SIZES, LENS = (1, 4), (64, 256)


Rows = tuple[tuple[float, ...], ...]


def profile(rows: Rows, base: float, tps: float, pbase: float, **fit: float) -> CostModel:
    return CostModel(
        DecodeCost(base_ms=base, per_request_ms=2.0, table=DecodeTable(SIZES, LENS, rows)),
        PrefillCost(base_ms=pbase, tokens_per_s=tps, per_request_ms=1.0),
        {"name": "profile:tiny", "notes": ["measured"],
         "fit": {"decode_mean_abs_error_pct": 4.0, "decode_max_abs_error_pct": 9.0,
                 "prefill_mean_abs_error_pct": 1.0, "prefill_max_abs_error_pct": 2.0,
                 "outliers": 0, "loop_overhead_ms": 0.2, **fit}},
    )  # fmt: skip


SLOW = profile(((20.0, 40.0), (50.0, 60.0)), base=30.0, tps=100.0, pbase=8.0)
FAST = profile(((10.0, 20.0), (30.0, 40.0)), base=10.0, tps=300.0, pbase=4.0)


def test_the_mean_table_and_coefficients_predict_the_mean_of_the_predictions() -> None:
    mean = average_profiles([FAST, SLOW], ["fast.json", "slow.json"])
    assert mean.decode.table is not None
    assert mean.decode.table.ms == ((15.0, 30.0), (40.0, 50.0))
    assert mean.decode.base_ms == 20.0 and mean.decode.per_request_ms == 2.0
    # 2 requests × 64 tokens: a third of the way from 1 request to 4 in each table:
    # fast 10 + 20/3 = 16.67, slow 20 + 30/3 = 30, their mean 23.33 ms
    assert 1000 * mean.decode.seconds(2, 128) == pytest.approx((10 + 20 / 3 + 30) / 2)
    # 100 and 300 tokens/s are 10 and 3.33 ms per token: the mean 6.67 ms is 150 tokens/s, not 200
    assert mean.prefill.tokens_per_s == pytest.approx(150.0)
    assert mean.prefill.base_ms == 6.0 and mean.prefill.per_request_ms == 1.0
    # a 300-token prefill: fast 4 + 1 ms + 1 s, slow 8 + 1 ms + 3 s; the mean 2.007 s
    assert mean.prefill.seconds(1, 300, 0) == pytest.approx(2.007)


def test_the_spread_says_how_far_the_profiles_differ() -> None:
    fit = average_profiles([FAST, SLOW], ["fast.json", "slow.json"]).meta["fit"]
    # each point's |profile − mean| / mean: 5/15, 10/30, 10/40, 10/50 → mean 27.92%, max 33.33%
    assert fit["profile_spread_mean_pct"] == pytest.approx(100 * (1 / 3 + 1 / 3 + 0.25 + 0.2) / 4, abs=0.01)
    assert fit["profile_spread_max_pct"] == pytest.approx(33.33, abs=0.01)
    assert fit["profiles_averaged"] == 2 and fit["loop_overhead_ms"] == 0.2


def test_three_profiles_weigh_equally() -> None:
    mid = profile(((12.0, 30.0), (40.0, 50.0)), base=20.0, tps=150.0, pbase=6.0)
    mean = average_profiles([FAST, SLOW, mid], ["a", "b", "c"])
    assert mean.decode.table is not None and mean.decode.table.ms[0][0] == pytest.approx(14.0)
    assert mean.prefill.tokens_per_s == pytest.approx(150.0)  # (10 + 3.33 + 6.67) / 3 = 6.67 ms per token


def test_profiles_of_different_grids_are_refused_naming_both() -> None:
    other = CostModel(DecodeCost(table=DecodeTable((1, 8), LENS, ((1.0, 2.0), (3.0, 4.0)))), PrefillCost())
    with pytest.raises(ProfileAverageError, match=r"b\.json measured batch sizes \[1, 8\].*a\.json \[1, 4\]"):
        average_profiles([FAST, other], ["a.json", "b.json"])


def test_a_profile_with_the_serving_overhead_added_is_refused() -> None:
    served = profile(((20.0, 40.0), (50.0, 60.0)), 30.0, 100.0, 8.0, serving_overhead_base_ms=1.0)
    with pytest.raises(ProfileAverageError, match="already has a serving-stack overhead"):
        average_profiles([FAST, served], ["a.json", "served.json"])


def test_one_profile_or_a_model_without_a_table_is_refused() -> None:
    with pytest.raises(ProfileAverageError, match="at least two profiles, got 1"):
        average_profiles([FAST], ["a.json"])
    with pytest.raises(ProfileAverageError, match="no measured decode table"):
        average_profiles([FAST, CostModel()], ["a.json", "preset.json"])


def _kvadmit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvadmit", *args], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def decode_line(running: int, step_ms: float, tokens: int) -> str:
    return "[2026-12-01 00:00:00] " + DECODE.render(
        running_req=running, num_used_tokens=tokens, token_usage=0.1, graph_label="cpu graph", graph=False,
        gen_throughput=running / (step_ms / 1000), queue_req=0,
    )  # fmt: skip


def test_the_cli_averages_then_fits_the_serving_log_against_the_mean(tmp_path: Path) -> None:
    a, b, out, log = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "mean.json", tmp_path / "serve.log"
    FAST.write(str(a))
    SLOW.write(str(b))
    # the mean table: 15 ms at 1 request × 64, 40 at 4 × 64; the server took 17 and 43: 1 + 1 × B beyond it
    log.write_text("\n".join([decode_line(1, 17.0, 64)] * 4 + [decode_line(4, 45.0, 256)] * 4) + "\n")
    run = _kvadmit("profile", "--average", str(a), str(b), "--serving-log", str(log), "-o", str(out))
    assert run.returncode == 0, run.stderr
    assert "averaged: 2 profiles" in run.stdout and "27.92% on average, 33.33% at most" in run.stdout
    written = CostModel.from_file(str(out))
    assert written.decode.table is not None
    # residuals 2 ms at 1 request and 5 at 4: 1 + 1 × B, added to the mean table
    assert written.decode.table.ms[0][0] == pytest.approx(17.0, abs=0.02)
    assert written.decode.table.ms[1][0] == pytest.approx(45.0, abs=0.02)
    assert json.loads(out.read_text())["fit"]["profiles_averaged"] == 2
    again = _kvadmit("profile", "--average", str(out), str(a))
    assert again.returncode == 2 and "already has a serving-stack overhead" in again.stderr
    assert "Traceback" not in again.stderr


def test_the_cli_refuses_measuring_options_with_average(tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    FAST.write(str(a))
    run = _kvadmit("profile", "--average", str(a), str(a), "--batch-sizes", "1,2", "--repeats", "3")
    assert run.returncode == 2
    assert "--average measures nothing: --batch-sizes, --repeats cannot go with it" in run.stderr
    missing = _kvadmit("profile", "--average", str(a), str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "cannot read cost model" in missing.stderr
    assert "Traceback" not in missing.stderr + run.stderr

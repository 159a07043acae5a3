"""Cost models calibrated from SGLang logs: real excerpts (logs 03, 04, 07 of one Qwen3-4B server) and
the mission document's small-pool run, simulated with a model fitted to its own quoted log lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.calibrate import CalibrationError, calibrate, calibrate_files
from kvadmit.costmodel.fit import fit_step_time
from kvadmit.observe import loglines
from kvadmit.sim.run import SimConfig, simulate

LOGS = Path(__file__).parent / "data" / "logs"
Q2_RUN = [LOGS / name for name in (
    "03-sglang-q2-qwen3-4b-healthy-ramp.log",
    "04-sglang-q2-qwen3-4b-retraction-burst.log",
    "07-sglang-q2-qwen3-4b-queue-drain.log",
)]  # fmt: skip
MISSION_LOG = Path(__file__).parent / "data" / "mission-small-pool.log"


def test_a_model_calibrated_on_the_q2_run_predicts_its_gen_throughput_within_15_percent() -> None:
    cal = calibrate_files([str(p) for p in Q2_RUN])
    known = [w for w in cal.windows if w.window_known]
    # Every Decode batch line of the three excerpts is one window.
    assert len(cal.windows) == sum(
        1 for p in Q2_RUN for line in p.read_text().splitlines() if "Decode batch" in line
    )
    assert len(known) == len(cal.windows) - 3  # the first line of each excerpt starts an unseen window
    for w in known:
        assert abs(cal.error(w)) < 0.15, (w.where, w.gen_throughput, cal.predicted_gen_throughput(w))
    mean_error = sum(abs(cal.error(w)) for w in known) / len(known)
    assert mean_error < 0.05
    # Physically sensible: a fixed cost per step (weights) and a cost per KV token read.
    d = cal.cost.decode
    assert d.base_ms > 0 and d.per_kv_token_ms > 0
    assert cal.cost.meta["fit"]["decode_windows"] == len(cal.windows)


def test_the_window_of_a_drained_queue_carries_its_prefills() -> None:
    # 07 line 15: five Prefill batch lines (702 + 2048 + 1598 + 2048 + 1924 tokens) fall between it and
    # the decode line before; their time is part of what its gen throughput divides by.
    cal = calibrate_files([str(Q2_RUN[2])])
    w = next(w for w in cal.windows if w.where.endswith(":15"))
    assert [t for _, t, _ in w.prefills] == [702, 2048, 1598, 2048, 1924]
    decode_only = (
        cal.decode_log_interval
        * w.batch
        / (
            cal.decode_log_interval * cal.cost.decode.seconds(w.batch, w.kv_tokens)  # type: ignore[arg-type]
        )
    )
    assert cal.predicted_gen_throughput(w) < decode_only


def test_the_mission_run_simulated_with_its_own_calibration_waits_as_reported() -> None:
    cal = calibrate([("mission", MISSION_LOG.read_text().splitlines())])
    # The quoted decode lines are excerpts (… between them): every window is unseen, no prefill in it.
    assert [w.window_known for w in cal.windows] == [False, False, False]
    # The one back-to-back prefill line: 896 tokens at 3889.60 tokens/s.
    assert cal.cost.prefill.tokens_per_s == pytest.approx(3889.60)
    cfg = SimConfig(
        args=ServerArgs(max_total_tokens=4096),
        workload=WorkloadSpec(num_prompts=32, input_len=256, output_len=512, range_ratio=1.0),
        cost=cal.cost,
        max_concurrency=16,
    )
    lines: list[str] = []
    result = simulate(cfg, emit_log=lines.append)
    assert result.metrics.ttft_ms["median"] == pytest.approx(27943.11, rel=0.15)
    decodes = [f for f in map(loglines.DECODE.parse, lines) if f is not None]
    assert max(d["running_req"] for d in decodes) == 5
    assert decodes[0]["queue_req"] == 11


def test_the_fit_recovers_known_coefficients_and_keeps_them_non_negative() -> None:
    rows = [{"batch": b, "kv": b * c} for b in (1, 4, 16, 64) for c in (128, 1024, 4096)]
    truth = [5.0 + 0.02 * r["batch"] + 0.0001 * r["kv"] for r in rows]
    fit = fit_step_time(rows, truth, ("one", "batch", "kv"))
    assert fit.coef == pytest.approx({"one": 5.0, "batch": 0.02, "kv": 0.0001}, rel=1e-9)
    assert fit.max_abs_error < 1e-9
    # Step times that fall with the batch would need a negative coefficient: the column is dropped.
    falling = [10.0 - 0.01 * r["batch"] for r in rows]
    fit = fit_step_time(rows, falling, ("one", "batch", "kv"))
    assert all(v >= 0 for v in fit.coef.values())


def test_strict_selection_drops_a_term_that_cuts_the_error_by_less_than_ln_n_over_n() -> None:
    # 100 rows: y = 10 + 0.1 (0.36 z + w), z = b − 1.5 = ±½ by turns, w = +1, +1, −1, −1 (orthogonal to
    # 1 and to z). On "one" alone the residuals are 0.1 (0.36 z + w): SSE ∝ 0.0324 + 1; with "b" too only
    # 0.1 w is left: SSE ∝ 1, 3.1% less (relative errors, y within 1.5% of 10: about the same).
    # FPE keeps "b" when SSE falls by over 1 − (101/99) ÷ (102/98) = 2.0%; strict only when n ln of the
    # FPE falls by over ln 100 − 2 = 2.61, i.e. SSE by over 1 − e^−0.0261 × (101/99) ÷ (102/98) = 4.5%.
    rows = [{"b": 2.0 if i % 2 == 0 else 1.0} for i in range(100)]
    y = [10 + 0.1 * (0.36 * (r["b"] - 1.5) + (1 if i % 4 < 2 else -1)) for i, r in enumerate(rows)]
    assert fit_step_time(rows, y, ("one", "b")).terms == ("one", "b")
    strict = fit_step_time(rows, y, ("one", "b"), "strict")
    assert strict.terms == ("one",)
    assert strict.coef["one"] == pytest.approx(10.0, rel=1e-3)
    # A term that explains most of the error stays under either: y = 10 + b exactly.
    exact = [10 + r["b"] for r in rows]
    assert fit_step_time(rows, exact, ("one", "b"), "strict").coef == pytest.approx({"one": 10.0, "b": 1.0})


def test_one_far_off_observation_is_left_out_of_the_fit() -> None:
    rows = [{"batch": b} for b in range(1, 21)]
    y = [2.0 + 0.5 * b for b in range(1, 21)]
    y[7] *= 3  # a window that held an unlogged prefill
    fit = fit_step_time(rows, y, ("one", "batch"))
    assert fit.outliers == (7,)
    assert fit.coef == pytest.approx({"one": 2.0, "batch": 0.5}, rel=1e-9)


def test_a_log_without_decode_lines_cannot_be_calibrated() -> None:
    with pytest.raises(CalibrationError, match="no Decode batch line"):
        calibrate([("x", ["[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 5"])])


def test_the_cli_writes_a_cost_model_that_simulate_reads(tmp_path: Path) -> None:
    out = tmp_path / "q2.json"
    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "calibrate", *map(str, Q2_RUN), "-o", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "decode step  =" in run.stdout and "fit error" in run.stdout
    sim = subprocess.run(
        [sys.executable, "-m", "kvadmit", "simulate", "--max-total-tokens", "87552", "--num-prompts", "20",
         "--random-input-len", "351", "--random-output-len", "200", "--cost-model", str(out), "--quiet"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    assert "Successful requests:                     20" in sim.stdout


def test_calibrating_a_missing_file_is_one_line_and_exit_status_2() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "calibrate", "/nonexistent.log"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2 and "cannot read '/nonexistent.log'" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1

"""The serving stack's overhead per step, read from a server log (costmodel/serving_overhead.py). The
logs here are written with the server's own line formats; the expected fit is worked out by hand."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvadmit.costmodel.costmodel import CostModel, DecodeCost, DecodeTable, PrefillCost
from kvadmit.costmodel.serving_overhead import (
    ServingOverhead,
    ServingOverheadError,
    add_overhead,
    measure_overhead,
    measure_prefill_overhead,
)
from kvadmit.observe.loglines import DECODE, PREFILL

COST = CostModel(DecodeCost(base_ms=100.0), PrefillCost(tokens_per_s=1000.0))


def decode(running: int, step_ms: float, tokens: int = 500) -> str:
    return "[2026-12-01 00:00:00] " + DECODE.render(
        running_req=running, num_used_tokens=tokens, token_usage=0.1, graph_label="cpu graph", graph=False,
        gen_throughput=running / (step_ms / 1000), queue_req=0,
    )  # fmt: skip


def prefill() -> str:
    return "[2026-12-01 00:00:00] " + PREFILL.render(
        new_seq=1, new_token=10, cached_token=0, token_usage=0.1, running_req=2, queue_req=0, pending_token=0,
        graph_label="cpu graph", graph=False, input_throughput=100.0,
    )  # fmt: skip


def test_each_logged_step_minus_the_executor_time_fits_a_plus_b_per_request() -> None:
    # A step of B requests takes 100 ms in the executor and 100 + 2 + 0.5 × B ms on the server.
    lines = [decode(4, 999.0)]  # no decode line before it: its window is not one step, left out
    for b in (4, 8, 12, 16):
        lines += [decode(b, 102 + 0.5 * b), decode(b, 102 + 0.5 * b)]
    lines += [prefill(), decode(6, 5000.0)]  # covers the prefill too: left out
    lines += ['INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK', decode(6, 105.0)]
    oh = measure_overhead([lines], COST)
    assert oh.steps == 9  # the 8 lines of the pairs, and the last (an access line between is no step)
    # (gen throughput is logged with two decimals: the step times come back to within ~0.01 ms)
    assert oh.base_ms == pytest.approx(2.0, abs=0.05) and oh.per_request_ms == pytest.approx(0.5, abs=0.005)
    assert oh.batch_sizes == (4, 16)
    assert oh.ms(10) == pytest.approx(7.0, abs=0.05)


def test_the_overhead_goes_into_every_step_of_the_cost_model() -> None:
    table = DecodeTable((1, 4), (100,), ((10.0,), (20.0,)))
    cost = CostModel(DecodeCost(base_ms=9.0, per_request_ms=1.0, table=table),
                     PrefillCost(base_ms=1.0, tokens_per_s=1000.0, per_request_ms=0.5))  # fmt: skip
    lines = [decode(1, 13.0, 100)] * 4 + [decode(4, 24.5, 400)] * 4  # gen throughputs 76.92 and 163.27
    oh = measure_overhead([lines], cost)  # residuals: 3 ms at 1 request, 4.5 at 4 → 2.5 + 0.5 × B
    assert oh.base_ms == pytest.approx(2.5, abs=0.01) and oh.per_request_ms == pytest.approx(0.5, abs=0.005)
    out = add_overhead(cost, oh, "serve.log")
    assert out.decode.table is not None
    assert out.decode.table.ms[0][0] == pytest.approx(13.0, abs=0.01)
    assert out.decode.table.ms[1][0] == pytest.approx(24.5, abs=0.01)
    assert out.decode.base_ms == pytest.approx(11.5, abs=0.01)
    assert out.decode.per_request_ms == pytest.approx(1.5, abs=0.005)
    assert out.prefill.base_ms == pytest.approx(3.5, abs=0.01)
    assert out.prefill.per_request_ms == pytest.approx(1.0, abs=0.005)
    assert "from 7 decode steps (1–4 running) of serve.log" in out.meta["notes"][-1]


def test_one_batch_size_gives_a_constant() -> None:
    oh = measure_overhead([[decode(3, 104.0)] * 6], COST)
    assert oh.base_ms == pytest.approx(4.0, abs=0.05) and oh.per_request_ms == 0.0


def test_a_log_without_consecutive_decode_lines_is_refused_with_the_fix() -> None:
    with pytest.raises(ServingOverheadError, match="--decode-log-interval 1"):
        measure_overhead([[decode(2, 50.0), prefill(), decode(2, 50.0)]], COST)


def test_the_cli_refuses_an_unreadable_serving_log_before_measuring(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "profile", "--serving-log", str(tmp_path / "none.log")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2 and "cannot read" in run.stderr and "Traceback" not in run.stderr


def test_the_fit_is_of_medians_per_batch_size_and_never_negative() -> None:
    # 4 requests: residuals 3, 3, 3 and one step 900 ms slow (the machine's other work): the median is 3.
    lines = [decode(4, 103.0)] * 4 + [decode(4, 1000.0), decode(4, 103.0)]
    lines += [decode(8, 105.0)] * 5  # 8 requests: 5
    oh = measure_overhead([lines], COST)
    assert oh.base_ms == pytest.approx(1.0, abs=0.05) and oh.per_request_ms == pytest.approx(0.5, abs=0.01)
    # Residuals 1 ms at 10 requests (5 steps: the first line has no decode line before it), 11 ms at 20
    # (6 steps): the line's intercept (−9) is below 0, so the fit goes through the origin instead:
    # b = Σ w·B·m / Σ w·B² = (5·10·1 + 6·20·11) / (5·100 + 6·400) = 1370 / 2900 = 0.4724.
    lines = [decode(10, 101.0)] * 6 + [decode(20, 111.0)] * 6
    oh = measure_overhead([lines], COST)
    assert oh.base_ms == 0.0 and oh.per_request_ms == pytest.approx(1370 / 2900, abs=0.002)
    # A server faster than the profile (negative residuals) adds nothing.
    oh = measure_overhead([[decode(3, 90.0)] * 6], COST)
    assert oh.base_ms == 0.0 and oh.ms(3) == 0.0


def test_several_logs_are_read_apart_and_fitted_together() -> None:
    # Log 1: 4 requests, residual 3 ms (5 steps after its first line); log 2 opens with a decode line
    # 900 ms after log 1's last (another server, another time): not a step; then 8 requests, residual 5.
    first = [decode(4, 103.0)] * 6
    second = [decode(8, 1000.0)] + [decode(8, 105.0)] * 5
    oh = measure_overhead([first, second], COST)
    assert oh.steps == 10 and oh.batch_sizes == (4, 8)
    assert oh.base_ms == pytest.approx(1.0, abs=0.05) and oh.per_request_ms == pytest.approx(0.5, abs=0.01)
    # read as one log, the 1,000 ms line would be a step of its own
    assert measure_overhead([first + second], COST).steps == 11


def test_the_cli_takes_several_serving_logs(tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    table = DecodeTable((4, 8), (100,), ((100.0,), (100.0,)))
    model = CostModel(DecodeCost(base_ms=100.0, table=table), PrefillCost(tokens_per_s=1000.0),
                      {"fit": {"decode_mean_abs_error_pct": 1.0, "decode_max_abs_error_pct": 1.0,
                               "prefill_mean_abs_error_pct": 1.0, "prefill_max_abs_error_pct": 1.0,
                               "loop_overhead_ms": 0.2}})  # fmt: skip
    model.write(str(a))
    one, two = tmp_path / "one.log", tmp_path / "two.log"
    one.write_text("\n".join([decode(4, 103.0, 400)] * 6) + "\n")
    two.write_text("\n".join([decode(8, 1000.0, 800)] + [decode(8, 105.0, 800)] * 5) + "\n")
    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "profile", "--average", str(a), str(a), "--serving-log", str(one),
         str(two)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    # (gen throughput is logged with two decimals: 1.03 + 0.497 comes back)
    shown = (r"serving stack: ([\d.]+) \+ ([\d.]+) × running requests ms per step beyond the executor "
             r"\(10 decode steps of .*one\.log, .*two\.log, 4–8 running\)")  # fmt: skip
    found = re.search(shown, run.stdout)
    assert found, run.stdout
    assert float(found[1]) == pytest.approx(1.0, abs=0.05) and float(found[2]) == pytest.approx(0.5, abs=0.01)


def step(kind: str, requests: int, new: int, ms: float, cached: int = 0) -> dict[str, object]:
    """A row as `kvadmit serve --trace-steps` writes it (the fields the prefill fit reads, and others)."""
    return {"step": 1, "t": 1.0, "kind": kind, "batch_size": requests, "new_tokens": new,
            "cached_tokens": cached, "seconds": ms / 1000, "running": 0, "queue": 0}  # fmt: skip


def test_the_prefill_steps_median_excess_replaces_a_plus_b_in_every_prefill_step() -> None:
    table = DecodeTable((1, 4), (100,), ((10.0,), (20.0,)))
    cost = CostModel(DecodeCost(base_ms=9.0, per_request_ms=1.0, table=table),
                     PrefillCost(base_ms=1.0, tokens_per_s=1000.0, per_request_ms=0.5))  # fmt: skip
    # The model's prefill: 1 + 0.5 × R + N / 1000 tokens per ms. Served: 1×100 takes 101.5 → 111.5
    # (+10), 2×200 202 → 214 (+12), 1×50 51.5 → 59.5 (+8), 1×60 61.5 → 961.5 (+900: a stall), and 1×40
    # over 20 cached 41.5 → 50.5 (+9): the median is 10, whatever the stall. Decode rows are not read.
    rows = [step("prefill", 1, 100, 111.5), step("decode", 4, 4, 500.0), step("prefill", 2, 200, 214.0),
            step("prefill", 1, 50, 59.5), step("prefill", 1, 60, 961.5),
            step("prefill", 1, 40, 50.5, cached=20)]  # fmt: skip
    prefill = measure_prefill_overhead([("steps.jsonl", rows)], cost)
    assert prefill.steps == 5 and prefill.ms == pytest.approx(10.0, abs=1e-6)
    decode_fit = ServingOverhead(2.5, 0.5, 7, (1, 4), 3.0)
    out = add_overhead(cost, decode_fit, "serve.log", (prefill, "steps.jsonl"))
    # decode as before: 2.5 + 0.5 × B on every decode step
    assert out.decode.table is not None and out.decode.table.ms[1][0] == pytest.approx(24.5)
    # prefill: + 10 ms a step; not + 2.5 + 0.5 × R
    assert out.prefill.base_ms == pytest.approx(11.0) and out.prefill.per_request_ms == pytest.approx(0.5)
    assert out.prefill.seconds(2, 200, 0) == pytest.approx(0.212)
    assert "the median of 5 prefill steps of steps.jsonl" in out.meta["notes"][-1]
    assert out.meta["fit"]["serving_prefill_overhead_ms"] == 10.0


def test_prefill_steps_faster_than_the_profile_add_nothing_and_too_few_are_refused() -> None:
    rows = [step("prefill", 1, 100, 90.0)] * 5  # the model: 100 ms
    assert measure_prefill_overhead([("a", rows)], COST).ms == 0.0
    with pytest.raises(ServingOverheadError, match=r"only 4 prefill steps.*--trace-steps"):
        measure_prefill_overhead([("a", rows[:2]), ("b", [*rows[:2], step("decode", 1, 1, 9.0)])], COST)
    with pytest.raises(ServingOverheadError, match="b step line 2: a prefill step needs batch_size"):
        measure_prefill_overhead([("a", rows), ("b", [rows[0], {"kind": "prefill", "seconds": "x"}])], COST)


def test_the_cli_fits_prefill_steps_from_serving_steps_files(tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    table = DecodeTable((4, 8), (100,), ((100.0,), (100.0,)))
    errors = ("decode_mean", "decode_max", "prefill_mean", "prefill_max")
    fit = {**{f"{e}_abs_error_pct": 1.0 for e in errors}, "loop_overhead_ms": 0.2}
    CostModel(DecodeCost(base_ms=100.0, table=table), PrefillCost(tokens_per_s=1000.0), {"fit": fit}).write(
        str(a)
    )
    log = tmp_path / "serve.log"
    log.write_text("\n".join([decode(4, 103.0, 400)] * 6) + "\n")  # decode: + 3 ms a step
    steps = tmp_path / "steps.jsonl"
    # the model's prefill of N tokens takes N ms; served: + 7, + 7, + 7, + 40, + 2 → the median, 7 ms
    rows = [step("prefill", 1, n, n + extra) for n, extra in ((100, 7), (50, 7), (80, 7), (60, 40), (90, 2))]
    steps.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.json"
    base = ["profile", "--average", str(a), str(a), "--serving-log", str(log)]
    run = subprocess.run([sys.executable, "-m", "kvadmit", *base, "--serving-steps", str(steps), "-o",
                          str(out)], capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert (
        "serving stack, prefill: 7.00 ms per prefill step beyond the executor (the median of 5" in run.stdout
    )
    assert "added to every decode step" in run.stdout
    written = CostModel.from_file(str(out))
    assert written.prefill.seconds(1, 100, 0) == pytest.approx(0.107)
    assert written.decode.table is not None and written.decode.table.ms[0][0] == pytest.approx(
        103.0, abs=0.05
    )

    def refused(*args: str) -> str:
        average = ["profile", "--average", str(a), str(a)]
        done = subprocess.run([sys.executable, "-m", "kvadmit", *average, *args],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        return done.stderr

    assert "--serving-steps refines --serving-log's fit for prefill steps: give both" in refused(
        "--serving-steps", str(steps)
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\nnot json\n")
    assert f"--serving-steps {bad} line 2: not a JSON object" in refused(
        "--serving-log", str(log), "--serving-steps", str(bad)
    )
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(rows[0]) + "\n")
    assert "--serving-steps: only 1 prefill steps" in refused(
        "--serving-log", str(log), "--serving-steps", str(one)
    )
    assert "cannot read" in refused(
        "--serving-log", str(log), "--serving-steps", str(tmp_path / "none.jsonl")
    )

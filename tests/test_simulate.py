"""`kvadmit simulate`: the scheduler on a virtual clock with a bench_serving-like client."""

from __future__ import annotations

import io
import itertools
import subprocess
import sys
from collections import Counter

import pytest

from kvadmit.bench.metrics import BenchmarkMetrics
from kvadmit.bench.summary import render_summary
from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.observe import loglines
from kvadmit.sim.run import SimConfig, SimResult, simulate


def run(cfg: SimConfig) -> tuple[SimResult, list[str]]:
    lines: list[str] = []
    return simulate(cfg, emit_log=lines.append), lines


MISSION = SimConfig(
    args=ServerArgs(max_total_tokens=4096),
    workload=WorkloadSpec(num_prompts=32, input_len=256, output_len=512, range_ratio=1.0),
    cost=CostModel.simple(decode_step_ms=24.26, prefill_tokens_per_s=10_000),
    max_concurrency=16,
)


def parsed(lines: list[str], fmt: loglines.LineFormat) -> list[dict[str, object]]:
    return [f for f in (fmt.parse(line) for line in lines) if f is not None]


def test_the_mission_small_pool_run() -> None:
    result, lines = run(MISSION)
    decodes = parsed(lines, loglines.DECODE)
    prefills = parsed(lines, loglines.PREFILL)
    # Exactly five run at once; eleven wait through the first wave.
    assert max(d["running_req"] for d in decodes) == 5
    assert decodes[0]["queue_req"] == 11
    # Usage climbs above 0.90 and never past 5 × 768 / 4096 = 0.9375 (printed 0.94).
    usage = [float(d["token_usage"]) for d in decodes]  # type: ignore[arg-type]
    assert max(usage) > 0.90 and max(usage) <= 0.94
    # The warm-up request, then waves of five (32 = 6 × 5 + 2).
    assert [p["new_seq"] for p in prefills] == [1, 5, 5, 5, 5, 5, 5, 2]
    assert not any("Retract" in line for line in lines)
    m = result.metrics
    assert m.completed == 32 and m.total_output == 32 * 512 and m.total_input == 32 * 256
    assert m.concurrency > 5  # the client's open requests, while five run
    assert m.tpot_ms["mean"] == pytest.approx(24.26)


def test_early_stops_decay_the_ratio_until_retraction_and_nothing_is_lost() -> None:
    cfg = SimConfig(
        args=ServerArgs(max_total_tokens=8192),
        workload=WorkloadSpec(
            num_prompts=1000, input_len=128, output_len=512, range_ratio=1.0, ignore_eos=False
        ),
        cost=CostModel.simple(decode_step_ms=20, prefill_tokens_per_s=10_000),
        max_concurrency=256,
    )
    result, lines = run(cfg)
    retracts = parsed(lines, loglines.RETRACT)
    assert retracts, "the ratio decays to its floor and the pool overflows"
    assert all(r["old_ratio"] == pytest.approx(0.098, abs=5e-5) for r in retracts)
    assert all(float(r["new_ratio"]) > 0.098 for r in retracts)  # type: ignore[arg-type]
    ended = Counter(result.finished_rids)
    assert len(ended) == 1000 + 1 and set(ended.values()) == {1}  # every request (and the warm-up) once
    # Each stopped exactly at its drawn length (EOS), retracted or not.
    from kvadmit.bench.workload import build_workload

    specs, _ = build_workload(cfg.workload)
    assert [o.output_len for o in result.outcomes] == [
        min(s.true_output_len, s.max_new_tokens) for s in specs
    ]
    assert result.metrics.completed == 1000
    sched = result.scheduler
    assert sched.is_fully_idle()
    sched.cache.reset()
    assert sched.pool.available_size() == sched.max_total_num_tokens  # no leak


def test_the_printed_ratio_is_the_formulas() -> None:
    # Observe each retraction with the requests that stayed, and recompute the ratio from the rule.
    # The non-overlap loop: the step right after a retraction is the next decode (under the overlap loop
    # the step in flight comes first; tests/test_overlap_loop.py checks the ratio there).
    cfg = SimConfig(
        args=ServerArgs(max_total_tokens=8192, disable_overlap_schedule=True),
        workload=WorkloadSpec(
            num_prompts=600, input_len=128, output_len=512, range_ratio=1.0, ignore_eos=False
        ),
        cost=CostModel.simple(decode_step_ms=20, prefill_tokens_per_s=10_000),
        max_concurrency=256,
    )
    from kvadmit.scheduler.events import Retraction

    pending: list[Retraction] = []
    checked: list[float] = []

    def on_event(event: object, now: float) -> None:
        if isinstance(event, Retraction):
            pending.append(event)

    def on_step(batch: object, result: object, now: float) -> None:
        # The decode step right after a retraction runs exactly the requests that stayed; each now has
        # one more output than when the ratio was computed.
        if pending:
            event = pending.pop()
            kept = batch.reqs  # type: ignore[attr-defined]
            outs = sum(len(q.output_ids) - 1 for q in kept)
            max_new = sum(q.max_new_tokens for q in kept)
            assert event.new_ratio == min(1.0, (outs + 20 * len(kept)) / (max_new + 1))
            checked.append(event.new_ratio)

    lines: list[str] = []
    result = simulate(cfg, emit_log=lines.append, watch_steps=(on_step,), watch_events=(on_event,))
    assert result.retractions >= 1 and len(checked) == result.retractions
    printed = [fields["new_ratio"] for fields in parsed(lines, loglines.RETRACT)]
    assert printed == [round(r, 4) for r in checked]


def test_a_seed_makes_a_run_reproducible() -> None:
    a_result, a_lines = run(MISSION)
    b_result, b_lines = run(MISSION)
    assert a_lines == b_lines
    assert a_result.metrics == b_result.metrics
    other = SimConfig(**{**{f: getattr(MISSION, f) for f in MISSION.__slots__}, "workload": WorkloadSpec(
        num_prompts=32, input_len=256, output_len=512, range_ratio=0.5, seed=7)})  # fmt: skip
    assert run(other)[1] != a_lines


REFERENCE_BLOCK = """
============ Serving Benchmark Result ============
Backend:                                 sglang    
Traffic request rate:                    inf       
Max request concurrency:                 16        
Successful requests:                     32        
Benchmark duration (s):                  88.91     
Total input tokens:                      8192      
Total input text tokens:                 8192      
Total generated tokens:                  16384     
Total generated tokens (retokenized):    16384     
Request throughput (req/s):              0.36      
Input token throughput (tok/s):          92.14     
Output token throughput (tok/s):         184.28    
Peak output token throughput (tok/s):    211.00    
Peak concurrent requests:                16        
Total token throughput (tok/s):          276.42    
Concurrency:                             13.06     
----------------End-to-End Latency----------------
Mean E2E Latency (ms):                   36000.00  
Median E2E Latency (ms):                 36000.00  
P90 E2E Latency (ms):                    36000.00  
P95 E2E Latency (ms):                    36000.00  
P99 E2E Latency (ms):                    36000.00  
---------------Time to First Token----------------
Mean TTFT (ms):                          27943.11  
Median TTFT (ms):                        27943.11  
P90 TTFT (ms):                           27943.11  
P95 TTFT (ms):                           27943.11  
P99 TTFT (ms):                           27943.11  
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          24.26     
Median TPOT (ms):                        24.26     
P90 TPOT (ms):                           24.26     
P95 TPOT (ms):                           24.26     
P99 TPOT (ms):                           24.26     
---------------Inter-Token Latency----------------
Mean ITL (ms):                           24.26     
Median ITL (ms):                         24.26     
P90 ITL (ms):                            24.26     
P95 ITL (ms):                            24.26     
P99 ITL (ms):                            24.26     
Max ITL (ms):                            24.26     
=================================================="""  # noqa: W291 — bench_serving's rows end in spaces


def test_the_summary_block_matches_bench_serving_line_for_line() -> None:
    def same(v: float) -> dict[str, float]:
        return {"mean": v, "median": v, "p90": v, "p95": v, "p99": v}

    m = BenchmarkMetrics(
        completed=32, total_input=8192, total_input_text=8192, total_output=16384,
        total_output_retokenized=16384, request_throughput=0.36, input_throughput=92.14,
        output_throughput=184.28, total_throughput=276.42, max_output_tokens_per_s=211.0,
        max_concurrent_requests=16, concurrency=13.06, e2e_ms=same(36000.0), ttft_ms=same(27943.11),
        tpot_ms=same(24.26), itl_ms={**same(24.26), "max": 24.26},
    )  # fmt: skip
    block = render_summary(
        m, backend="sglang", request_rate=float("inf"), max_concurrency=16, duration_s=88.91
    )
    assert block.split("\n") == REFERENCE_BLOCK.split("\n")


def test_the_cli_prints_log_lines_then_the_summary(tmp_path: object) -> None:
    run_ = subprocess.run(
        [sys.executable, "-m", "kvadmit", "simulate", "--max-total-tokens", "4096", "--num-prompts", "8",
         "--random-input-len", "64", "--random-output-len", "32", "--max-concurrency", "4"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run_.returncode == 0, run_.stderr
    out = run_.stdout.splitlines()
    assert (
        out[0] == "Scheduling as SGLang 0.5.22 with the overlap event loop (SGLang's default; "
        "--disable-overlap-schedule for the other)"
    )
    assert out[1].startswith("[2026-01-01 00:00:00] max_total_num_tokens=4096")
    assert "============ Serving Benchmark Result ============" in out
    assert any(line.startswith("Successful requests:") and line.split()[2] == "8" for line in out)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-prompts", "3"], "--max-total-tokens is required"),
        (["--max-total-tokens", "4096", "--request-rate", "0"], "--request-rate must be > 0"),
        (["--max-total-tokens", "4096", "--decode-step-ms", "0"], "--decode-step-ms must be > 0"),
        (["--max-total-tokens", "4096", "--cost-model", "/nonexistent.json"], "cannot read cost model"),
        (["--max-total-tokens", "4096", "--random-range-ratio", "2"], "--random-range-ratio must be within"),
    ],
)
def test_bad_simulate_input_is_one_line_and_exit_status_2(args: list[str], message: str) -> None:
    run_ = subprocess.run(
        [sys.executable, "-m", "kvadmit", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run_.returncode == 2 and message in run_.stderr
    assert len(run_.stderr.strip().splitlines()) == 1


def test_request_and_step_traces_are_json_lines() -> None:
    import json

    requests, steps = io.StringIO(), io.StringIO()
    cfg = SimConfig(**{**{f: getattr(MISSION, f) for f in MISSION.__slots__}, "max_concurrency": 4})
    simulate(cfg, request_trace=requests, step_trace=steps)
    rows = [json.loads(line) for line in requests.getvalue().splitlines()]
    assert len(rows) == 32 and all(r["output_len"] == 512 and r["success"] for r in rows)
    kinds = Counter(json.loads(line)["kind"] for line in steps.getvalue().splitlines())
    assert kinds["decode"] > 0 and kinds["prefill"] > 0


def test_token_times_kept_as_decode_runs_equal_a_per_token_record() -> None:
    # Record every token's time the slow way (each step, each request of the batch) and compare with
    # the TTFT and ITL gaps the client derives from prefill times and runs of decode steps.
    per_token: dict[str, list[float]] = {}

    def record(batch: object, result: object, now: float) -> None:
        # A request got a token in this step if its output grew (not a chunk; under the overlap loop not
        # one that ended or was retracted while the step was in flight); a retraction drops none.
        for req in batch.reqs:  # type: ignore[attr-defined]
            times = per_token.setdefault(req.rid, [])
            if len(req.output_ids) > len(times):
                times.append(now)

    cfg = SimConfig(
        args=ServerArgs(max_total_tokens=8192, chunked_prefill_size=256),
        workload=WorkloadSpec(
            num_prompts=600, input_len=600, output_len=512, range_ratio=0.1, ignore_eos=False
        ),
        cost=CostModel.simple(decode_step_ms=20, prefill_tokens_per_s=10_000),
        max_concurrency=256,
    )
    result = simulate(cfg, watch_steps=(record,))
    assert result.retractions >= 1  # runs are broken by retraction and re-prefill
    for i, outcome in enumerate(result.outcomes):
        times = per_token[f"req-{i}"]
        assert outcome.ttft == times[0] - outcome.start_time
        assert list(outcome.itl) == [b - a for a, b in itertools.pairwise(times)]


def test_random_ids_prompts_are_bench_servings() -> None:
    from kvadmit.bench.workload import SimRequest

    spec = SimRequest(index=3, prompt_len=10, output_len=1, max_new_tokens=1, true_output_len=None,
                      ignore_eos=True, offset=95)  # fmt: skip
    assert spec.prompt(100) == [(95 + 3 + j) % 100 for j in range(10)]
    assert SimRequest(0, 250, 1, 1, None, True, 7).prompt(100) == [(7 + j) % 100 for j in range(250)]


def test_lengths_are_drawn_as_bench_serving_draws_them() -> None:
    import numpy as np

    from kvadmit.bench.workload import build_workload

    specs, _ = build_workload(
        WorkloadSpec(num_prompts=50, input_len=300, output_len=200, range_ratio=0.25, seed=7)
    )
    np.random.seed(
        7
    )  # bench_serving: np.random.seed(--seed), input lengths, then output lengths, then offsets
    inputs = np.random.randint(75, 301, size=50).tolist()
    outputs = np.random.randint(50, 201, size=50).tolist()
    offsets = np.random.randint(0, 32000, size=50).tolist()
    assert [s.prompt_len for s in specs] == inputs
    assert [s.output_len for s in specs] == outputs
    assert [s.offset for s in specs] == offsets


def test_a_request_rate_spaces_arrivals_by_seeded_exponential_gaps() -> None:
    import json

    import numpy as np

    trace = io.StringIO()
    cfg = SimConfig(
        args=ServerArgs(max_total_tokens=100_000),
        workload=WorkloadSpec(num_prompts=200, input_len=64, output_len=16, range_ratio=1.0),
        cost=CostModel.simple(decode_step_ms=10, prefill_tokens_per_s=100_000),
        request_rate=4.0,
    )
    simulate(cfg, request_trace=trace)
    arrivals = [json.loads(line)["arrival"] for line in trace.getvalue().splitlines()]
    rng = np.random.RandomState(42)
    rng.randint(64, 65, size=200), rng.randint(16, 17, size=200), rng.randint(0, 32000, size=200)
    expected = np.concatenate(([0.0], np.cumsum([rng.exponential(1 / 4.0) for _ in range(199)])))
    # The server is idle enough that each request is sent the moment it arrives.
    assert arrivals == pytest.approx(expected.tolist(), abs=1e-6)


def test_stop_lengths_can_come_from_a_file(tmp_path: object) -> None:
    import json
    from pathlib import Path

    lens = Path(str(tmp_path)) / "lens.txt"
    lens.write_text("3\n5\n")
    trace = Path(str(tmp_path)) / "trace.jsonl"
    run_ = subprocess.run(
        [sys.executable, "-m", "kvadmit", "simulate", "--max-total-tokens", "4096", "--num-prompts", "4",
         "--random-input-len", "16", "--random-output-len", "64", "--random-range-ratio", "1",
         "--disable-ignore-eos", "--output-lens-file", str(lens), "--trace-requests", str(trace), "--quiet"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run_.returncode == 0, run_.stderr
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [r["output_len"] for r in rows] == [3, 5, 3, 5]
    assert all(r["max_new_tokens"] == 64 for r in rows)


def test_prompts_that_never_fit_fail_the_warm_up_or_are_counted_failed() -> None:
    base = [sys.executable, "-m", "kvadmit", "simulate", "--max-total-tokens", "100", "--num-prompts", "3",
            "--random-input-len", "200", "--random-range-ratio", "1", "--quiet"]  # fmt: skip
    warm = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
    # max_req_len = min(32768 − 1, 100 − 1) = 99: a 200-token prompt is refused at arrival.
    assert warm.returncode == 2 and "the warm-up request failed: Input length (200 tokens)" in warm.stderr
    assert len(warm.stderr.strip().splitlines()) == 1 and "Traceback" not in warm.stderr
    run_ = subprocess.run(
        [*base, "--warmup-requests", "0"], capture_output=True, text=True, timeout=60, check=False
    )
    assert run_.returncode == 0, run_.stderr
    assert any(line.split()[:3] == ["Successful", "requests:", "0"] for line in run_.stdout.splitlines())
    assert "3 of 3 requests failed" in run_.stderr


def test_a_crash_of_the_simulated_sglang_is_one_error_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Where SGLang's scheduler raises (an out-of-memory chunk: tests/test_scheduler_properties.py), its
    # server dies; `simulate` says so in one line and exits 1 (the scheduler below it is stood in for).
    import kvadmit.sim.run
    from kvadmit.cli import main
    from kvadmit.scheduler.errors import EngineCrash, out_of_memory_message

    def crash(*_: object, **__: object) -> SimResult:
        raise EngineCrash(out_of_memory_message(8, 0, 0, 1))

    monkeypatch.setattr(kvadmit.sim.run, "simulate", crash)
    code = main(
        ["simulate", "--max-total-tokens", "4096", "--num-prompts", "2", "--enable-mixed-chunk", "--quiet"]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(
        "kvadmit simulate: the simulated SGLang 0.5.22 server died: RuntimeError: Out of memory. Try to "
        "lower your batch size.\nTry to allocate 8 tokens.\n"
    ), err
    assert "Traceback" not in err

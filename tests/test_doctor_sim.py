"""The doctor on logs kvadmit writes itself (they print SGLang's lines): the mission's small-pool run is a
healthy queue whose explanation rebuilds the admission arithmetic; an early-stop run whose forecast is too
bold retracts in a storm, and the same run with --schedule-conservativeness 1.3 does not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.doctor.diagnose import Inputs, diagnose
from kvadmit.doctor.model import Diagnosis
from kvadmit.sim.run import SimConfig, simulate


def doctor_on(cfg: SimConfig, path: Path) -> Diagnosis:
    lines: list[str] = []
    simulate(cfg, emit_log=lines.append)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return diagnose(Inputs(log=str(path)))


def test_the_mission_small_pool_run_is_a_healthy_queue_where_five_fit_and_a_sixth_needs_4608(
    tmp_path: Path,
) -> None:
    log = tmp_path / "mission.log"
    cli = [sys.executable, "-m", "kvadmit"]
    subprocess.run(
        [
            *cli,
            "simulate",
            "--max-total-tokens",
            "4096",
            "--num-prompts",
            "32",
            "--random-input-len",
            "256",
            "--random-output-len",
            "512",
            "--random-range-ratio",
            "1",
            "--max-concurrency",
            "16",
            "--decode-step-ms",
            "24.26",
            "--log-file",
            str(log),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    out = subprocess.run(
        [*cli, "doctor", str(log), "--json"], check=True, capture_output=True, text=True, timeout=120
    )
    d = json.loads(out.stdout)
    assert d["verdict"] == "healthy-queue"
    lead = d["findings"][0]
    text = " ".join(lead["explanation"])
    # The mission: 256 + 512 = 768 tokens each; five reserve 3,840, a sixth would need 4,608 of 4,096.
    assert "Five fit at once and a sixth would need 4,608 of the 4,096 tokens" in text
    assert lead["numbers"]["running_at_once"] == 5
    assert lead["numbers"]["prompt_len"] == 256 and lead["numbers"]["max_new_tokens"] == 512
    assert any("max_total_num_tokens=4096" in e["text"] for e in lead["evidence"])
    assert not any(f["verdict"] in ("retraction-storm", "retraction-occasional") for f in d["findings"])


@pytest.mark.parametrize(
    ("pool", "prompt", "output", "interval"),
    [(2048, 100, 300, 40), (3000, 64, 700, 10)],
)
def test_the_request_shape_is_read_back_from_the_waves(
    tmp_path: Path, pool: int, prompt: int, output: int, interval: int
) -> None:
    cfg = SimConfig(
        args=ServerArgs(max_total_tokens=pool, decode_log_interval=interval, disable_overlap_schedule=True),
        workload=WorkloadSpec(num_prompts=40, input_len=prompt, output_len=output, range_ratio=1.0),
        cost=CostModel.simple(decode_step_ms=20, prefill_tokens_per_s=10_000),
        max_concurrency=32,
    )
    d = doctor_on(cfg, tmp_path / "waves.log")
    # The rule from an empty pool: the k-th request is admitted while prompt + output + 1 page fits
    # strictly under what the first k − 1 left.
    fit, left = 0, pool
    while prompt + output + 1 < left:
        fit += 1
        left -= prompt + output + 1
    assert d.verdict == "healthy-queue"
    assert d.lead.numbers["running_at_once"] == fit
    assert (d.lead.numbers["prompt_len"], d.lead.numbers["max_new_tokens"]) == (prompt, output)
    need = (fit + 1) * (prompt + output)
    assert f"would need {need:,} of the {pool:,} tokens" in d.lead.explanation[0]


def early_stop(conservativeness: float) -> SimConfig:
    """Requests ask for 2,048 tokens and stop uniformly early: the ratio decays to its floor, admission
    over-commits the pool and decode runs out of it. (The non-overlap loop: under the overlap loop the
    requests stopping on EOS keep their KV one more step, and 1.3 still retracts often.)"""
    return SimConfig(
        args=ServerArgs(
            max_total_tokens=16384, schedule_conservativeness=conservativeness, disable_overlap_schedule=True
        ),
        workload=WorkloadSpec(
            num_prompts=800, input_len=128, output_len=2048, range_ratio=1.0, ignore_eos=False
        ),
        cost=CostModel.simple(decode_step_ms=20, prefill_tokens_per_s=10_000),
        max_concurrency=128,
    )


def test_an_early_stop_run_with_frequent_retractions_is_a_storm(tmp_path: Path) -> None:
    d = doctor_on(early_stop(1.0), tmp_path / "storm.log")
    assert d.verdict == "retraction-storm", d.lead.title
    assert d.lead.numbers["per_minute_low"] > 1.0  # more than ~1/min even at the low end of chance
    assert "--schedule-conservativeness" in " ".join(d.lead.advice)


def test_the_same_run_with_conservativeness_1_3_is_not_a_storm(tmp_path: Path) -> None:
    d = doctor_on(early_stop(1.3), tmp_path / "calm.log")
    verdicts = [f.verdict for f in d.findings]
    assert "retraction-storm" not in verdicts
    retraction = next(f for f in d.findings if f.verdict == "retraction-occasional")
    assert retraction.numbers["per_minute"] <= 1.0

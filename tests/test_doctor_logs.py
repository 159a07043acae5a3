"""Every real log excerpt gets the verdict its README label gives, with the lines that show it.

The labels are read from tests/data/logs/README.md (the first word of the Label column); the quoted
fragments each test expects in the evidence are the ones that README's "Why" column quotes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvadmit.doctor.diagnose import Inputs, diagnose
from kvadmit.doctor.model import Diagnosis

LOGS = Path(__file__).parent / "data" / "logs"


def readme_labels() -> dict[str, str]:
    labels: dict[str, str] = {}
    for row in (LOGS / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in row.split("|")]
        if len(cells) > 6 and cells[2].endswith(".log"):
            labels[cells[2]] = re.split(r"[\s(]", cells[5])[0]
    return labels


LABELS = readme_labels()

# README's quoted evidence, per file: fragments that must appear in the lead finding's evidence lines.
QUOTED = {
    "03-sglang-q2-qwen3-4b-healthy-ramp.log": ["#running-req: 21", "token usage: 0.16", "token usage: 0.25"],
    "04-sglang-q2-qwen3-4b-retraction-burst.log": ["0.0980 -> 0.3487", "0.4869 -> 0.5907"],
    "07-sglang-q2-qwen3-4b-queue-drain.log": ["#queue-req: 30", "#queue-req: 8"],
    "09-sglang-7133-mi300x-low-usage-large-queue.log": [
        "token usage: 0.19, #running-req: 370, #queue-req: 646"
    ],
    "10-sglang-2746-dsv3-decode-oom-retract-all-ranks.log": ["#new_token_ratio: 0.0980 -> 0.9446"],
    "14-sglang-14948-no-space-left-for-one-request.log": ["No space left for only one request"],
    "17-sglang-3695-h20-health-generate-crash.log": ["Abort request", "token usage: 0.00"],
    "20-sglang-11854-h20-pd-decode-healthy.log": ["#running-req: 32", "token usage: 0.2"],
    "22-sglang-docs-hyperparameter-reference-lines.log": ["token usage: 0.82", "#queue-req: 317"],
    "25-sglang-13485-metrics-sample.log": ["sglang:token_usage{", "sglang:num_running_reqs{"],
    "26-vllm-5578-swap-preemption-chunked-prefill.log": ["total_num_cumulative_preemption=151", "Swapped: "],
    "30-vllm-metal-479-metrics-waiting-capacity-empty-kv.log": [
        'reason="capacity"} 6.0',
        "kv_cache_usage_perc",
    ],
    # 31–46: gathered after the doctor was tuned, each labelled before the doctor ran on it.
    "31-sglang-938-a100-full-pool-huge-queue.log": [
        "#running-req: 1010",
        "token usage: 0.93",
        "#queue-req: 12279",
    ],
    "32-sglang-3909-steady-decode-no-queue.log": ["#running-req: 8", "#queue-req: 0", "token usage: 0.13"],
    "33-sglang-4407-decode-drain-after-burst.log": ["#running-req: 509", "token usage: 0.43"],
    "34-sglang-22166-mixed-prefill-decode-cuda-graph.log": ["#running-req: 32", "token usage: 0.08"],
    "35-sglang-26248-swa-throughput-collapse-after-retraction.log": [
        "gen throughput (token/s): 429.52",
        "gen throughput (token/s): 24.33",
        "full token usage: 0.92",
    ],
    "36-sglang-30047-hybrid-mamba-prefill-burst.log": [
        "#queue-req: 97",
        "#queue-req: 49",
        "mamba usage: 0.60",
    ],
    "37-sglang-1612-v03-prefill-burst-cache-hit-rate.log": [
        "#new-token: 8192",
        "#queue-req: 38",
        "#queue-req: 18",
    ],
    "38-sglang-6291-v046-prefix-cached-prefills.log": ["#cached-token: 12019", "#queue-req: 0"],
    "39-sglang-36081-dsv4-chunked-long-prompt-swa.log": [
        "#new-token: 8192",
        "#pending-token: 46401",
        "#pending-token: 13638",
    ],
    "40-sglang-4184-dsr1-decode-oom-tp-ranks.log": ["0.1474 -> 0.1845", "0.0980 -> 0.1919", "0.1207 ->"],
    "41-sglang-14972-overlap-retract-tiny-pool-full.log": ["token usage: 0.94", "#queue-req: 5"],
    "42-sglang-11970-v053-prefill-burst-chunked-budget.log": [
        "#queue-req: 114",
        "#queue-req: 53",
        "#new-token: 8192",
    ],
    "43-sglang-11948-eagle3-accept-len-single-request.log": ["#queue-req: 0", "token usage: 0.00"],
    "44-openclaw-rl-44-ray-prefixed-decode.log": ["(SGLangEngine pid=41820)", "#running-req: 6"],
    "45-sglang-1270-v02-time-only-decode.log": ["[04:40:55 TP0]", "token usage: 0.00"],
    "46-sglang-25960-npu-terminal-cut-columns.log": ["#queue-req: 81", "#queue-req: 82"],
    # 47–53: a second batch, labelled before the doctor with the fixes for 31–46 ran on it.
    "47-sglang-6081-dp-attention-mtp-accept-len.log": ["DP0 TP0", "token usage: 0.13", "#queue-req: 0"],
    "48-sglang-17392-pd-decode-dp-ranks-transfer-req.log": ["#transfer-req: 0", "token usage: 0.01"],
    "49-sglang-13023-decode-drain-cuda-graph-flip.log": ["#running-req: 46", "token usage: 0.19"],
    "50-llama-benchy-15-slow-prefill-swa-no-queue.log": ["#new-token: 2048", "#queue-req: 0"],
    "51-sglang-22331-hisparse-flat-token-count.log": ["#token: 20800", "token usage: 0.29"],
    "52-sglang-23177-glm-queue-at-max-prefill-budget.log": [
        "#new-seq: 6, #new-token: 15360",
        "#queue-req: 238",
    ],
    "53-sglang-2255-v04-chunk-budget-queue-growing.log": [
        "#queue-req: 30",
        "#queue-req: 155",
        "#new-token: 2048",
    ],
    # 54–62: a third batch, labelled before the doctor (with the fixes for 31–53) ran on it.
    "54-sgl-kernel-npu-608-eagle-queue-pool-two-thirds.log": ["token usage: 0.63", "#queue-req: 4"],
    "55-sglang-4305-collector-double-timestamp-no-queue.log": [
        "#running-req: 5",
        "token usage: 0.61",
        "#queue-req: 0",
    ],
    "56-sglang-6901-compose-prefix-prefill-budget-queue-growing.log": [
        "#new-seq: 3, #new-token: 15000",
        "#queue-req: 40",
        "#queue-req: 56",
    ],
    "57-sglang-10053-single-chat-cached-turns.log": ["token usage: 0.00", "#queue-req: 0"],
    "58-sglang-19712-no-prefix-chunked-prompt-health-checks.log": ["#new-token: 2048", "#queue-req: 2"],
    "59-sglang-jax-564-cache-miss-field-single-request.log": ["#cache_miss: 1", "#queue-req: 0"],
    "60-sglang-6778-tp-only-prefix-full-pool.log": ["#running-req: 36", "token usage: 0.96"],
    "61-sglang-4602-v044-decode-oom-page-size.log": ["Decode out of memory. Try to lower your batch size"],
    "62-sglang-4161-startup-lines-only-tp-ranks.log": ["max_total_num_tokens=201681"],
}


def run(name: str) -> Diagnosis:
    return diagnose(Inputs(log=str(LOGS / name)))


def test_the_readme_lists_every_shared_log() -> None:
    assert sorted(LABELS) == sorted(p.name for p in LOGS.glob("*.log"))
    assert sorted(QUOTED) == sorted(LABELS)


@pytest.mark.parametrize("name", sorted(LABELS))
def test_each_shared_log_gets_its_label_with_quoted_evidence(name: str) -> None:
    d = run(name)
    assert d.verdict == LABELS[name], d.lead.title
    lines = (LOGS / name).read_text(encoding="utf-8").split("\n")
    evidence = d.lead.evidence
    assert evidence, "a verdict comes with the lines that show it"
    for q in evidence:  # quoted verbatim, with the right line number
        assert lines[q.line - 1] == q.text
    joined = "\n".join(q.text for q in evidence)
    for fragment in QUOTED[name]:
        assert fragment in joined, f"{fragment!r} not in the evidence of {name}"
    assert d.lead.advice or d.verdict in ("other",), "a verdict other than 'other' says what to do"


def test_a_retraction_printed_by_five_ranks_is_one_event() -> None:
    d = run("10-sglang-2746-dsv3-decode-oom-retract-all-ranks.log")
    assert d.lead.numbers["events"] == 1 and d.lead.numbers["lines"] == 5


def test_the_retraction_burst_is_sixteen_events_in_seventeen_seconds_and_stalls_admission() -> None:
    d = run("04-sglang-q2-qwen3-4b-retraction-burst.log")
    # README: 16 retraction lines between 16:06:07 and 16:06:24; the log spans 16:06:04–16:06:24.
    assert d.lead.numbers["events"] == 16
    assert d.lead.numbers["per_minute"] == pytest.approx(16 / 21 * 60)
    stall = next(f for f in d.findings if f.kind == "admission-stall")
    assert stall.numbers["queued_after"] == 58 and stall.numbers["running_after"] == 41
    advice = " ".join(d.lead.advice)
    assert "--schedule-conservativeness" in advice and "1.3" in advice and "--max-running-requests" in advice
    assert "--mem-fraction-static alone" in advice


def test_the_low_usage_queue_is_told_to_lower_conservativeness_or_fix_max_new_tokens() -> None:
    d = run("09-sglang-7133-mi300x-low-usage-large-queue.log")
    advice = " ".join(d.lead.advice)
    assert "0.3" in advice and "max_new_tokens" in advice
    # The batch took 16,384 new tokens: the default --max-prefill-tokens capped that pass.
    assert any("16,384" in line for line in d.lead.explanation)


def test_the_health_probe_crash_is_not_blamed_on_admission() -> None:
    d = run("17-sglang-3695-h20-health-generate-crash.log")
    assert "admission is not the cause" in d.lead.title


def test_the_oom_assertion_is_dated_to_its_release_wording() -> None:
    d = run("14-sglang-14948-no-space-left-for-one-request.log")
    assert any("≤ 0.5.6" in line for line in d.lead.explanation)


def test_the_docs_reference_queue_has_the_pool_from_its_startup_line() -> None:
    d = run("22-sglang-docs-hyperparameter-reference-lines.log")
    assert d.lead.numbers["pool"] == 665690
    assert any(f.verdict == "retraction-occasional" for f in d.findings[1:])


def test_the_json_timeline_has_the_retractions_with_their_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    from kvadmit.cli import main

    assert main(["doctor", str(LOGS / "04-sglang-q2-qwen3-4b-retraction-burst.log"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["verdict"] == "retraction-storm" and d["summary"] == d["findings"][0]["title"]
    markers = d["timeline"]["markers"]
    assert [m["label"] for m in markers][:2] == ["0.0980 -> 0.3487", "0.3397 -> 0.3530"]
    assert len(markers) == 16 and all(m["kind"] == "retract" for m in markers)
    points = d["timeline"]["series"]["scheduler"]
    assert d["timeline"]["x_unit"] == "s"
    assert (points[0]["running"], points[0]["queued"], points[0]["tokens"]) == (67, 9, 81316)
    assert points[-1]["queued"] == 58
    assert d["inputs"][0]["unknown"] == 0 and d["inputs"][0]["lines"] == 71

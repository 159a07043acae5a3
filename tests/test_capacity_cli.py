"""`kvadmit capacity` as a user runs it: a real process, its output and exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def kvadmit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvadmit", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_five_fit_and_a_sixth_would_need_4608() -> None:
    run = kvadmit("capacity", "--max-total-tokens", "4096", "--input-len", "256", "--output-len", "512")
    assert run.returncode == 0, run.stderr
    assert "5 run at once" in run.stdout
    assert "6 × (256 + 512) = 4,608 tokens" in run.stdout
    assert "(512) plus one page (1): 769 tokens" in run.stdout


def test_with_early_stops_the_decaying_ratio_lets_more_in() -> None:
    run = kvadmit(
        "capacity", "--max-total-tokens", "4096", "--input-len", "256", "--output-len", "512",
        "--no-ignore-eos", "--json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)["by_ratio"]
    assert rows[0]["new_token_ratio"] == pytest.approx(0.7)
    assert rows[-1]["new_token_ratio"] == pytest.approx(0.098)
    counts = [row["running_at_once"] for row in rows]
    assert counts == sorted(counts) and counts[-1] > counts[0] > 5
    # At ratio 0.7 with five just-started requests running (257 held each, 511 × 0.7 reserved each):
    # 4096 − 1285 − 1788.5 = 1022.5 > 769 admits a sixth; with six running 407.8 < 769 stops a seventh.
    assert counts[0] == 6


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


SNAPSHOT = {
    "server": {"max_total_tokens": 4096, "page_size": 1, "chunked_prefill_size": 8192},
    "new_token_ratio": 0.7,
    "running": [{"rid": "a", "prompt_len": 256, "output_len": 40, "max_new_tokens": 512, "ignore_eos": True}],
    "waiting": [
        {"rid": "b", "prompt_len": 256, "cached_prefix_len": 0, "max_new_tokens": 512, "ignore_eos": True}
    ],
}


def test_a_scenario_answers_with_designs_fields(tmp_path: Path) -> None:
    run = kvadmit("capacity", "--scenario", write(tmp_path, "s.json", json.dumps(SNAPSHOT)), "--json")
    assert run.returncode == 0, run.stderr
    ans = json.loads(run.stdout)
    assert set(ans) == {
        "admitted", "chunked", "extend_lens", "prefix_lens", "verdict", "stopped_at", "preempted",
        "rem_total_tokens", "cur_rem_tokens", "rem_input_tokens", "rem_chunk_tokens", "explanation",
    }  # fmt: skip
    # a holds 296 and reserves 512 − 40 = 472 (ignore_eos: × 1.0): 4096 − 296 − 472 = 3328;
    # b needs 769 and is charged 769: 2559 remain.
    assert ans["admitted"] == ["b"] and ans["rem_total_tokens"] == 3328 - 769


def test_a_jsonl_scenario_gets_one_answer_line_each(tmp_path: Path) -> None:
    decode = {**SNAPSHOT, "check": "decode", "waiting": []}
    text = json.dumps(SNAPSHOT) + "\n" + json.dumps({"snapshot": decode}) + "\n"
    run = kvadmit("capacity", "--scenario", write(tmp_path, "s.jsonl", text))
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(lines) == 2 and lines[0]["admitted"] == ["b"] and lines[1]["retract_called"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-total-tokens", "0", "--input-len", "1", "--output-len", "1"], "--max-total-tokens must be"),
        (["--max-total-tokens", "-5", "--input-len", "1", "--output-len", "1"], "--max-total-tokens must be"),
        (
            [
                "--max-total-tokens",
                "4096",
                "--input-len",
                "1",
                "--output-len",
                "1",
                "--schedule-conservativeness",
                "0",
            ],
            "--schedule-conservativeness must be > 0",
        ),
        (
            ["--max-total-tokens", "4096", "--input-len", "1", "--output-len", "1", "--page-size", "0"],
            "--page-size",
        ),
        (["--max-total-tokens", "4096", "--input-len", "5000", "--output-len", "10"], "can never fit"),
        (["--max-total-tokens", "4096"], "give --max-total-tokens, --input-len and --output-len"),
        (["--scenario", "/nonexistent/s.json"], "cannot read scenario file"),
        (["--max-total-tokens", "many"], "invalid int value"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(args: list[str], message: str) -> None:
    run = kvadmit("capacity", *args)
    assert run.returncode == 2
    assert message in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "line 1: not valid JSON"),
        (json.dumps({"server": {}}), "server.max_total_tokens is required"),
        (
            json.dumps({**SNAPSHOT, "running": [{"rid": "a", "prompt_len": -1, "max_new_tokens": 1}]}),
            "prompt_len",
        ),
        (json.dumps({**SNAPSHOT, "check": "both"}), 'check must be "admission" or "decode"'),
        (json.dumps({**SNAPSHOT, "evictable_tokens": 5000}), "more than the pool"),
        ("", "is empty"),
    ],
)
def test_a_malformed_scenario_is_one_line_and_exit_status_2(tmp_path: Path, text: str, message: str) -> None:
    run = kvadmit("capacity", "--scenario", write(tmp_path, "bad.json", text))
    assert run.returncode == 2
    assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_an_output_above_the_memory_cap_is_capped_as_the_server_would() -> None:
    # §1.9 arrival cap: min(max_req_len − input − 1, pool − ceil_page(input) − page − 1)
    # = min(4095 − 256 − 1, 4096 − 256 − 1 − 1) = 3838; then 256 + 3838 + 1 = 4095 < 4096 fits alone.
    run = kvadmit("capacity", "--max-total-tokens", "4096", "--input-len", "256", "--output-len", "100000")
    assert run.returncode == 0, run.stderr
    assert "caps max_new_tokens 100,000 at 3,838" in run.stdout
    assert "1 run at once; a 2nd would need 2 × (256 + 3,838) = 8,188" in run.stdout

"""`capacity --scenario` under the overlap loop: running requests in the step in flight (docs/sglang-rules.md
A.1; docs/architecture.md, "The snapshot format"). Expected values are the rules' arithmetic by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvadmit.capacity.answer import answer_admission, answer_decode
from kvadmit.capacity.snapshot import SnapshotError, parse_snapshot

SERVER = {"max_total_tokens": 100, "page_size": 1, "disable_radix_cache": True}


def _running(rid: str, output_len: int, max_new: int, **flags: bool) -> dict[str, Any]:
    return {"rid": rid, "prompt_len": 10, "output_len": output_len, "max_new_tokens": max_new, **flags}


def test_a_request_finishing_by_length_in_flight_makes_decode_skip_rather_than_retract() -> None:
    # a: 10 + 40 outputs + the in-flight slot = 51; b: 10 + 38 + 1 = 49; the pool of 100 is full. a's step in
    # flight commits its 41st output (40 + 1 ≥ 41): it leaves the batch. b alone needs 1 slot, 0 are free:
    # decode is skipped, nobody is retracted.
    snap = parse_snapshot({"server": SERVER, "check": "decode", "running": [
        _running("a", 40, 41, in_flight=True), _running("b", 38, 45, in_flight=True)]})  # fmt: skip
    out = answer_decode(snap)
    assert (out["retract_called"], out["retracted"], out["kept"], out.get("skipped")) == (
        False,
        [],
        ["b"],
        True,
    )
    assert any(
        "a finishes by length in the step in flight" in s and "51 tokens" in s for s in out["explanation"]
    )


def test_a_request_stopping_on_eos_in_flight_cannot_be_foreseen_and_b_is_retracted() -> None:
    # The same pool, but a stops on EOS in the step in flight (max_new 60): it stays in the check, 2 slots
    # are needed and 0 are free; b has fewer outputs (38 < 40) and goes. New ratio: (40 + 20 × 1) / (60 + 1).
    a = _running("a", 40, 60, in_flight=True, stops_in_flight=True)
    snap = parse_snapshot(
        {"server": SERVER, "check": "decode", "running": [a, _running("b", 38, 45, in_flight=True)]}
    )
    out = answer_decode(snap)
    assert (out["retract_called"], out["retracted"], out["kept"]) == (True, ["b"], ["a"])
    assert out["new_ratio"] == 60 / 61 and out["new_tokens_gained"] == 49
    assert any("a finishes on EOS (SGLang cannot foresee it)" in s for s in out["explanation"])


def test_admission_counts_the_finishing_requests_kv_and_reservation_and_names_the_lag() -> None:
    # Pool 200: a holds 10 + 40 + 1 = 51, so 149 are free; its reservation is min(41 − 40, 4096) × 0.7 = 0.7
    # (its output lags: 40, not 41). w needs 20 + 10 + 1 = 31 < 149 − 0.7 = 148.3: admitted.
    snap = parse_snapshot({"server": {**SERVER, "max_total_tokens": 200}, "new_token_ratio": 0.7,
                           "running": [_running("a", 40, 41, in_flight=True)],
                           "waiting": [{"rid": "w", "prompt_len": 20, "max_new_tokens": 10}]})  # fmt: skip
    out = answer_admission(snap)
    assert out["admitted"] == ["w"]
    assert out["rem_total_tokens"] == pytest.approx(149 - 0.7 - (20 + 1 + 10))
    assert (
        "a finishes by length in the step in flight: its 51 tokens and its reservation are released after "
        "this pass" in out["explanation"]
    )


@pytest.mark.parametrize(
    ("running", "server", "message"),
    [
        ([_running("a", 90, 95, in_flight=True)], SERVER, "hold 101 tokens"),
        ([_running("a", 1, 5, stops_in_flight=True)], SERVER, "stops_in_flight needs in_flight"),
        ([_running("a", 1, 5, in_flight=True)], {**SERVER, "disable_overlap_schedule": True}, "overlap loop"),
        ([_running("a", 1, 5, in_flight=1)], SERVER, "in_flight must be true or false"),  # type: ignore[arg-type]
    ],
)
def test_bad_in_flight_fields_get_one_clear_error(
    running: list[dict[str, Any]], server: dict[str, Any], message: str
) -> None:
    with pytest.raises(SnapshotError, match=message):
        parse_snapshot({"server": server, "check": "decode", "running": running})


def test_the_cli_reads_in_flight_requests(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"server": SERVER, "check": "decode", "running": [
        _running("a", 40, 41, in_flight=True), _running("b", 38, 45, in_flight=True)]}))  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "kvadmit", "capacity", "--scenario", str(path), "--json"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert '"skipped": true' in run.stdout

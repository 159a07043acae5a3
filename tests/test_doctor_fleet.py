"""`kvadmit doctor` on a fleet, on logs `kvadmit simulate --replicas N` / `--dp-size N` writes from
hand-made replay traces (all requests arrive at once, so the router deals them all before any answer):
a verdict per replica and for the fleet, the imbalance named with the router setting behind it, in the
one-log-with-rank-tags form and the several-logs form; bad input is one line and exit status 2.

The expected numbers come from how each workload was built:
* admission: a waiting request is admitted only when its uncached prompt + max_new_tokens (+ one page)
  is strictly less than what the pool has left, and the first prefill of a batch has no cached prefix;
* cache_aware (defaults --cache-threshold 0.3, --balance-abs-threshold 64): a request whose text matches
  over 30% of a replica's goes there unless in-flight counts differ by more than 64;
* round_robin (and --dp-size's round_robin): request i (no warm-up) to replica i mod N."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvadmit.cli import main
from kvadmit.doctor.fleet import diagnose_fleet
from kvadmit.doctor.fleet_prove import rank_log

POOL = 6000


def write_trace(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps({"arrival": 0.0, **r}) + "\n" for r in rows), encoding="utf-8")
    return path


def simulate(capsys: pytest.CaptureFixture[str], trace: Path, log: Path, *fleet: str) -> Path:
    argv = ["simulate", "--replay", str(trace), "--max-total-tokens", str(POOL), "--warmup-requests", "0",
            "--log-file", str(log), *fleet]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    return log


def doctor_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["doctor", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def rows_of(report: dict[str, object]) -> dict[str, dict[str, object]]:
    return {r["replica"]: r for r in report["replicas"]}  # type: ignore[index, union-attr]


def hot_prefix_trace(tmp: Path) -> Path:
    """40 requests of 500 prompt tokens and 300 output tokens (ignore_eos); every 4th (3, 7, …) is its own
    text, the other 30 share a 400-token prefix (then 100 tokens of their own)."""
    rows = []
    for k in range(40):
        if k % 4 == 3:
            ids = [1000 + 600 * k + j for j in range(500)]  # starts with a token no other prompt starts with
        else:
            ids = list(range(10, 410)) + [30000 + 100 * k + j for j in range(100)]
        rows.append({"prompt_len": 500, "max_new_tokens": 300, "output_len": 300, "ignore_eos": True,
                     "input_ids": ids})  # fmt: skip
    return write_trace(tmp / "hot.jsonl", rows)


def test_cache_aware_with_a_hot_prefix_overloads_one_replica_and_names_the_balance_thresholds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = simulate(capsys, hot_prefix_trace(tmp_path), tmp_path / "hot.log", "--replicas", "4",
                   "--router", "cache_aware")  # fmt: skip
    report = doctor_json(capsys, "--fleet", str(log))
    # Routing: req 0 (no match) → least loaded DP0; every shared-prefix request matches 450+/500 of DP0's
    # text → DP0 (in-flight gap ≤ 30 < 64); each own-text request (3, 7, 11, …) matches nothing → the least
    # loaded: DP1, DP2, DP3, DP1, … So 30 / 4 / 3 / 3.
    rows = rows_of(report)
    assert list(rows) == ["DP0", "DP1", "DP2", "DP3"]
    assert [rows[k]["requests"] for k in rows] == [30, 4, 3, 3]
    # DP0's first prefill has no cached prefix: 7 × (500 + 300) = 5,600 fits, an 8th (6,400) does not;
    # 23 wait. The others admit all theirs at once (4 × 800 = 3,200 < 6,000): no queue.
    assert [rows[k]["peak_queue"] for k in rows] == [23, 0, 0, 0]
    assert [rows[k]["state"] for k in rows] == ["queueing", "light", "light", "light"]
    assert [rows[k]["peak_in_flight"] for k in rows] == [30, 4, 3, 3]
    # DP0 prefilled 30 × 500 tokens, of which the 23 admitted later took 400 each from its cache.
    assert rows["DP0"]["cached_share"] == round(23 * 400 / (30 * 500), 4)
    assert [rows[k]["cached_share"] for k in ("DP1", "DP2", "DP3")] == [0.0, 0.0, 0.0]
    assert [rows[k]["retractions"] for k in ("DP1", "DP2", "DP3")] == [0, 0, 0]
    fleet = report["fleet"]
    assert report["verdict"] == "fleet-imbalance"
    assert fleet["numbers"]["cause"] == "shared-prefix"  # type: ignore[index]
    assert fleet["numbers"]["pressed"] == ["DP0"] and fleet["numbers"]["calm"] == ["DP1", "DP2", "DP3"]  # type: ignore[index]
    assert fleet["title"].startswith(
        "Imbalance: DP0 queues (peak queue 23) while DP1, DP2, DP3 have no queue"
    )  # type: ignore[index]
    # the gap in requests held at once: 30 − 4 = 26, under 64; the advice: a threshold under the 7 DP0
    # held when its queue formed, so cache_aware balances before DP0 queues
    assert "a gap of 26, under the default --balance-abs-threshold of 64" in " ".join(fleet["explanation"])  # type: ignore[index]
    assert any("--balance-abs-threshold 6 --balance-rel-threshold 1.2" in a for a in fleet["advice"])  # type: ignore[index]


def test_the_same_fleet_as_one_log_per_replica_gives_the_same_verdicts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = simulate(capsys, hot_prefix_trace(tmp_path), tmp_path / "hot.log", "--replicas", "4",
                   "--router", "cache_aware")  # fmt: skip
    tagged = doctor_json(capsys, "--fleet", str(log))
    lines = log.read_text(encoding="utf-8").splitlines()
    files = []
    for k in range(4):  # each replica's own log, as a server behind the router writes it: no rank tag
        f = tmp_path / f"replica{k}.log"
        f.write_text("".join(line.replace(f" DP{k}]", "]") + "\n" for line in lines if f" DP{k}]" in line))
        files.append(str(f))
    split = doctor_json(capsys, *files)
    assert [r["replica"] for r in split["replicas"]] == files  # type: ignore[union-attr, index]
    keys = ("verdict", "state", "requests", "peak_queue", "retractions", "usage_peak", "cached_share")
    for a, b in zip(tagged["replicas"], split["replicas"], strict=True):  # type: ignore[call-overload]
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert split["verdict"] == "fleet-imbalance"
    assert split["fleet"]["numbers"]["cause"] == "shared-prefix"  # type: ignore[index]
    assert split["fleet"]["numbers"]["pressed"] == [files[0]]  # type: ignore[index]


def alternating_trace(tmp: Path, big: dict[str, object]) -> Path:
    """20 requests alternating big (even) and small (odd: 50 prompt tokens, 20 output tokens)."""
    small = {"prompt_len": 50, "max_new_tokens": 20, "output_len": 20}
    return write_trace(tmp / "alt.jsonl", [dict(big if k % 2 == 0 else small) for k in range(20)])


def test_round_robin_deals_the_big_requests_to_one_replica_which_queues_while_the_other_idles(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    big = {"prompt_len": 1000, "max_new_tokens": 600, "output_len": 600, "ignore_eos": True}
    log = simulate(capsys, alternating_trace(tmp_path, big), tmp_path / "alt.log", "--replicas", "2",
                   "--router", "round_robin")  # fmt: skip
    report = doctor_json(capsys, "--fleet", str(log))
    rows = rows_of(report)
    assert [rows[k]["requests"] for k in rows] == [10, 10]
    # 3 × 1,600 = 4,800 fit; a 4th would need 6,400 of the 6,000 → 7 wait. 10 × 70 fit at once.
    assert [rows[k]["peak_queue"] for k in rows] == [7, 0]
    assert [rows[k]["prompt_per_request"] for k in rows] == [1000.0, 50.0]
    assert [rows[k]["state"] for k in rows] == ["queueing", "light"]
    assert report["verdict"] == "fleet-imbalance"
    assert report["fleet"]["numbers"]["cause"] == "in-turn"  # type: ignore[index]
    text = " ".join(report["fleet"]["explanation"])  # type: ignore[index]
    assert "1,000 prompt tokens per admission against 50 on the others" in text
    assert any("--policy power_of_two" in a for a in report["fleet"]["advice"])  # type: ignore[index]


RETRACTING_BIG = {"prompt_len": 500, "max_new_tokens": 3000, "output_len": 2800, "ignore_eos": False}
BOLD = ("--schedule-conservativeness", "0.3")


def test_dp_size_round_robin_one_rank_retracts_while_the_other_idles(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--schedule-conservativeness 0.3: a running request reserves 0.21 × its remaining 3,000 tokens, so
    a second big one is admitted (500 + 3,000 + 1 < 6,000 − 500 − 630); two stopping at 2,800 need
    2 × 3,300 = 6,600 > 6,000: the pool runs out, and the rank retracts."""
    log = simulate(capsys, alternating_trace(tmp_path, RETRACTING_BIG), tmp_path / "dp.log", "--dp-size", "2",
                   *BOLD)  # fmt: skip
    report = doctor_json(capsys, "--fleet", str(log))
    rows = rows_of(report)
    assert rows["DP0"]["state"] == "retracting" and rows["DP0"]["retractions"] >= 1  # type: ignore[operator]
    # every retracted request is admitted again: requests = admissions − retracted = the 10 dealt to it
    assert rows["DP0"]["admissions"] == 10 + rows["DP0"]["retracted_requests"]  # type: ignore[operator]
    assert [rows[k]["requests"] for k in rows] == [10, 10]
    assert rows["DP1"]["state"] == "light" and rows["DP1"]["retractions"] == 0
    assert rows["DP1"]["verdict"] == "healthy-queue" and rows["DP1"]["peak_queue"] == 0
    assert report["verdict"] == "fleet-imbalance"
    assert report["fleet"]["numbers"]["cause"] == "in-turn"  # type: ignore[index]
    assert report["summary"].startswith(
        f"Imbalance: DP0 retracts ({rows['DP0']['retracted_requests']} requests"
    )  # type: ignore[union-attr]


def test_every_replica_retracting_is_an_overloaded_fleet_not_a_routing_problem(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = write_trace(tmp_path / "big.jsonl", [RETRACTING_BIG] * 20)
    log = simulate(capsys, trace, tmp_path / "big.log", "--replicas", "2", "--router", "round_robin", *BOLD)
    report = doctor_json(capsys, "--fleet", str(log))
    rows = rows_of(report)
    assert [rows[k]["state"] for k in rows] == ["retracting", "retracting"]
    assert [rows[k]["requests"] for k in rows] == [10, 10]
    assert report["verdict"] == "fleet-overloaded"
    assert report["summary"].startswith(
        "Overloaded: every replica queues, retracts or fails (10 requests each)"
    )  # type: ignore[union-attr]
    assert any("--replicas 3" in a for a in report["fleet"]["advice"])  # type: ignore[index]


def capped_fleet(capsys: pytest.CaptureFixture[str], tmp_path: Path, cap: int) -> Path:
    """40 requests of 100 + 100 tokens dealt in turn to 2 replicas, each with --max-running-requests cap."""
    small = {"prompt_len": 100, "max_new_tokens": 100, "output_len": 100, "ignore_eos": True}
    trace = write_trace(tmp_path / "capped.jsonl", [small] * 40)
    return simulate(capsys, trace, tmp_path / f"capped{cap}.log", "--replicas", "2", "--router",
                    "round_robin", "--max-running-requests", str(cap))  # fmt: skip


def test_every_replica_capped_with_an_idle_pool_is_held_back_and_lifting_the_cap_clears_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Capped at 2, each replica admits 2 and queues 18, holding at most 2 × 200 of its 6,000 tokens: the
    cap, not the fleet's size, is the limit. The log shows usage every 40 decode steps
    (--decode-log-interval): a pair decodes 99 steps (its first token comes from the prefill), so the
    lines fall 40·m mod 99 steps into a pair, at most 88 for m ≤ 24: 2 × (100 + 88) = 376 tokens, usage
    0.06. Capped at 20 (the advice), each admits its 20 at once: 20 × (100 + 100) = 4,000, the 20th
    needing 201 < 6,000 − 19 × 200 = 2,200 left, so nothing queues."""
    report = doctor_json(capsys, "--fleet", str(capped_fleet(capsys, tmp_path, 2)))
    rows = rows_of(report)
    assert [rows[k]["verdict"] for k in rows] == ["idle-pool-with-queue"] * 2
    assert [rows[k]["peak_queue"] for k in rows] == [18, 18]
    assert report["verdict"] == "fleet-held-back"
    assert report["summary"] == (
        "Held back, not short of capacity: every replica queues with its KV pool mostly unused (token usage "
        "at most 0.06; 20 requests each): a setting of each replica holds the requests back"
    )
    advice = report["fleet"]["advice"]  # type: ignore[index]
    assert advice[0].startswith("Every replica's verdict says: Raise --max-running-requests (now 2)")
    report = doctor_json(capsys, "--fleet", str(capped_fleet(capsys, tmp_path, 20)))
    assert report["verdict"] == "fleet-healthy"
    assert [r["peak_queue"] for r in rows_of(report).values()] == [0, 0]


def test_with_one_log_per_replica_the_fleet_verdict_names_its_files_and_simulates_the_advice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The fleet verdict quotes each replica's peak lines (line numbers alone would not say which log), and
    simulates the replicas' advice from one replica's log."""
    lines = capped_fleet(capsys, tmp_path, 2).read_text(encoding="utf-8").splitlines()
    files = []
    for k in range(2):
        f = tmp_path / f"replica{k}.log"
        f.write_text("".join(line.replace(f" DP{k}]", "]") + "\n" for line in lines if f" DP{k}]" in line))
        files.append(str(f))
    report = doctor_json(capsys, *files)
    assert report["verdict"] == "fleet-held-back"
    for r in diagnose_fleet(files).replicas:
        n = r.numbers
        assert n.peak_queue and n.peak_usage and n.peak_in_flight
        assert {n.peak_queue[1].source, n.peak_usage[1].source, n.peak_in_flight[1].source} == {r.name}
    # the replicas' advice, simulated from the log of the replica that queued longest (a tie: the first):
    # twice the cap runs twice the requests at once, so its TTFT p50 is lower than the reconstruction's
    proof = report["fleet"]["numbers"]["proof"]  # type: ignore[index]
    assert proof["replica"] == files[0] and proof["what_if"] == "--max-running-requests 4 (twice the cap)"
    assert proof["advice"]["ttft_p50_ms"] < proof["today"]["ttft_p50_ms"]
    assert any(line.startswith(f"Simulated from {files[0]} alone") for line in report["fleet"]["explanation"])
    # not with --no-what-if
    assert "proof" not in doctor_json(capsys, *files, "--no-what-if")["fleet"]["numbers"]  # type: ignore[index]
    # from the one log of ranks the files were cut from: DP0's lines, its tag taken out, are the same server
    # log, so the same reconstruction and the same simulated figures
    tagged = doctor_json(capsys, "--fleet", str(tmp_path / "capped2.log"))["fleet"]["numbers"]["proof"]  # type: ignore[index]
    assert tagged["replica"] == "DP0"
    assert (tagged["today"], tagged["advice"]) == (proof["today"], proof["advice"])


def test_a_balanced_round_robin_fleet_is_healthy_and_the_text_report_matches_the_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    small = {"prompt_len": 200, "max_new_tokens": 100, "output_len": 100, "ignore_eos": True}
    trace = write_trace(tmp_path / "even.jsonl", [small] * 20)
    log = simulate(capsys, trace, tmp_path / "even.log", "--replicas", "4", "--router", "round_robin")
    report = doctor_json(capsys, "--fleet", str(log))
    rows = rows_of(report)
    assert [rows[k]["requests"] for k in rows] == [5, 5, 5, 5]  # 20 dealt in turn
    assert [rows[k]["peak_queue"] for k in rows] == [0, 0, 0, 0]  # 5 × 300 ≪ 6,000
    assert {rows[k]["state"] for k in rows} == {"light"}
    assert report["verdict"] == "fleet-healthy"
    assert report["summary"] == "Healthy: no replica queues or retracts (5 requests each)"
    assert main(["doctor", "--fleet", str(log)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(
        "Fleet verdict: fleet-healthy\n  Healthy: no replica queues or retracts (5 requests"
    )
    table = [line.split() for line in text.splitlines() if line.startswith("  DP")]
    assert [(t[0], t[1], t[2], t[3], t[4]) for t in table] == [
        (f"DP{k}", "healthy-queue", "5", "0", "0") for k in range(4)
    ]
    for t in table:
        assert t[5] == f"{rows[t[0]]['usage_peak']:.2f}"


def test_a_single_log_of_dp_ranks_keeps_its_single_verdict_and_points_to_fleet(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    small = {"prompt_len": 200, "max_new_tokens": 100, "output_len": 100, "ignore_eos": True}
    log = simulate(
        capsys, write_trace(tmp_path / "t.jsonl", [small] * 8), tmp_path / "dp.log", "--dp-size", "2"
    )
    report = doctor_json(capsys, str(log), "--no-what-if")
    assert "fleet" not in report and report["verdict"] == "healthy-queue"
    assert any("kvadmit doctor --fleet LOG" in n for n in report["inputs"][0]["notes"])  # type: ignore[index]


def test_bad_fleet_input_is_one_line_and_exit_status_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    small = {"prompt_len": 200, "max_new_tokens": 100, "output_len": 100, "ignore_eos": True}
    plain = simulate(capsys, write_trace(tmp_path / "t.jsonl", [small] * 4), tmp_path / "plain.log")
    one_rank = tmp_path / "dp0.log"
    one_rank.write_text("".join(line.replace("] ", " DP0] ", 1) + "\n" for line in
                                plain.read_text().splitlines() if line.startswith("[")))  # fmt: skip
    junk = tmp_path / "junk.log"
    junk.write_text("hello\nworld\n")
    cases = [
        (["--fleet", str(plain)], "has no data-parallel rank tags (DP0, DP1, …): a fleet needs one log per"),
        (["--fleet", str(one_rank)], "has only DP0: a fleet needs"),
        ([str(plain), str(tmp_path / "missing.log")], "cannot read"),
        ([str(plain), str(junk)], "no SGLang or vLLM log lines found in"),
        (["--fleet"], "--fleet needs a log of several data-parallel ranks"),
        (
            [str(plain), str(plain), "--what-if", "--schedule-conservativeness 1.3"],
            "--what-if reads one server",
        ),
        ([str(plain), str(plain), "--metrics", str(plain)], "--metrics reads one server"),
    ]
    for args, message in cases:
        assert main(["doctor", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err, (args, err)


def test_following_the_advice_on_the_hot_prefix_fleet_removes_the_imbalance(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With --balance-abs-threshold 6, cache_aware balances once DP0 holds 7 more than the least-loaded
    replica (7 − 0 > 6, 7 > 0 × 1.2): DP0 gets fewer than the 30 and its queue is shorter than 23."""
    log = simulate(capsys, hot_prefix_trace(tmp_path), tmp_path / "hot6.log", "--replicas", "4",
                   "--router", "cache_aware", "--balance-abs-threshold", "6",
                   "--balance-rel-threshold", "1.2")  # fmt: skip
    report = doctor_json(capsys, "--fleet", str(log))
    rows = rows_of(report)
    assert report["verdict"] != "fleet-imbalance"
    assert rows["DP0"]["requests"] < 30 and rows["DP0"]["peak_queue"] < 23  # type: ignore[operator]
    assert sum(r["requests"] for r in rows.values()) == 40  # type: ignore[misc]


def test_a_real_sglang_log_of_dp_ranks_is_read_per_rank(capsys: pytest.CaptureFixture[str]) -> None:
    """tests/data/logs/20-…: one Decode line each from DP2–DP5 of a PD decode server (prefix
    `2025-10-20 03:02:22 INFO 31223 [DP3 TP3 EP3 scheduler_metrics_mixin.py:222]`), 32 running, queues
    1 / 0 / 2 / 1, token usage 0.22 / 0.21 / 0.22 / 0.22. No Prefill line: the split is not in the log."""
    log = Path(__file__).parent / "data" / "logs" / "20-sglang-11854-h20-pd-decode-healthy.log"
    report = doctor_json(capsys, "--fleet", str(log))
    rows = rows_of(report)
    assert list(rows) == ["DP2", "DP3", "DP4", "DP5"]
    assert [rows[k]["peak_queue"] for k in rows] == [1, 0, 2, 1]
    assert [rows[k]["usage_peak"] for k in rows] == [0.22, 0.21, 0.22, 0.22]
    assert [rows[k]["requests"] for k in rows] == [None] * 4
    assert {rows[k]["state"] for k in rows} == {"light"}
    assert report["verdict"] == "fleet-healthy"
    assert report["summary"] == (
        "Healthy: no replica queues or retracts (requests admitted not shown: no Prefill lines)"
    )


def test_tensor_parallel_ranks_repeating_each_line_count_once_per_dp_rank(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """SGLang's `[… DP0 TP0]`, `[… DP0 TP1]`: every line of a DP rank printed by both of its TP ranks
    reads as the line once."""
    big = {"prompt_len": 1000, "max_new_tokens": 600, "output_len": 600, "ignore_eos": True}
    log = simulate(capsys, alternating_trace(tmp_path, big), tmp_path / "alt.log", "--dp-size", "2")
    tp = tmp_path / "tp.log"
    out = []
    for line in log.read_text(encoding="utf-8").splitlines():
        for rank in ("TP0", "TP1"):
            out.append(line.replace(" DP0]", f" DP0 {rank}]").replace(" DP1]", f" DP1 {rank}]"))
    tp.write_text("\n".join(out) + "\n", encoding="utf-8")
    plain, doubled = doctor_json(capsys, "--fleet", str(log)), doctor_json(capsys, "--fleet", str(tp))
    keys = ("verdict", "state", "requests", "admissions", "peak_queue", "retractions", "usage_peak")
    assert [{k: r[k] for k in keys} for r in doubled["replicas"]] == [  # type: ignore[union-attr]
        {k: r[k] for k in keys}
        for r in plain["replicas"]  # type: ignore[union-attr]
    ]
    assert [r["requests"] for r in doubled["replicas"]] == [10, 10]  # type: ignore[union-attr, index]
    assert doubled["verdict"] == plain["verdict"] == "fleet-imbalance"


def test_html_for_a_fleet_has_the_fleet_verdict_the_table_and_each_replicas_charts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    big = {"prompt_len": 1000, "max_new_tokens": 600, "output_len": 600, "ignore_eos": True}
    log = simulate(capsys, alternating_trace(tmp_path, big), tmp_path / "alt.log", "--replicas", "2",
                   "--router", "round_robin")  # fmt: skip
    page = tmp_path / "fleet.html"
    assert main(["doctor", "--fleet", str(log), "--html", str(page)]) == 0
    text = capsys.readouterr().out
    html = page.read_text(encoding="utf-8")
    assert text.startswith("Fleet verdict: fleet-imbalance")
    assert "<b>Fleet verdict: fleet-imbalance</b>" in html
    assert "<tr><td>DP0</td><td>healthy-queue</td><td>10</td><td>7</td>" in html  # requests, peak queue
    assert "<tr><td>DP1</td><td>healthy-queue</td><td>10</td><td>0</td>" in html
    assert html.count("<h2>DP") == 2 and html.count("<svg") == 6  # three panels per replica
    assert "<script" not in html
    assert main(["doctor", "--fleet", str(log), "--html", str(tmp_path / "no" / "such" / "dir.html")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_the_dp_controllers_setting_is_named_when_the_server_args_line_shows_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    big = {"prompt_len": 1000, "max_new_tokens": 600, "output_len": 600, "ignore_eos": True}
    log = simulate(capsys, alternating_trace(tmp_path, big), tmp_path / "dp.log", "--dp-size", "2")
    args = ("[2026-01-01 00:00:00] server_args=ServerArgs(model_path='m', tp_size=1, dp_size=2, "
            "load_balance_method='round_robin', max_total_tokens=6000)")  # fmt: skip
    shown = tmp_path / "shown.log"
    shown.write_text(args + "\n" + log.read_text(encoding="utf-8"), encoding="utf-8")
    report = doctor_json(capsys, "--fleet", str(shown))
    assert report["fleet"]["numbers"]["cause"] == "in-turn"  # type: ignore[index]
    assert (
        "Its server_args line shows this server's setting: --dp-size 2, --load-balance-method round_robin."
        in report["fleet"]["explanation"]  # type: ignore[index]
    )
    plain = doctor_json(capsys, "--fleet", str(log))
    assert not any("server_args" in line for line in plain["fleet"]["explanation"])  # type: ignore[index]


def test_a_ranks_lines_are_cut_from_a_log_of_ranks_as_its_own_server_prints_them(tmp_path: Path) -> None:
    """rank_log keeps the rank's tagged lines without its tag, and the stamped untagged lines every rank
    reads; the other ranks' lines go. Both places a tag is printed: kvadmit's `[… DP1]` and the real
    tests/data/logs/20-… prefix `[DP3 TP3 EP3 scheduler_metrics_mixin.py:222]`."""
    log = tmp_path / "ranks.log"
    log.write_text(
        "[2026-01-01 00:00:00] max_total_num_tokens=6000, chunked_prefill_size=4096\n"
        "[2026-01-01 00:00:01 DP0] Decode batch, #running-req: 2\n"
        "[2026-01-01 00:00:01 DP1] Decode batch, #running-req: 3\n"
        "[2026-01-01 00:00:02 DP1 TP0] Prefill batch, #new-seq: 1\n",
        encoding="utf-8",
    )
    out = tmp_path / "dp1.log"
    rank_log(str(log), "DP1", out)
    assert out.read_text(encoding="utf-8").splitlines() == [
        "[2026-01-01 00:00:00] max_total_num_tokens=6000, chunked_prefill_size=4096",
        "[2026-01-01 00:00:01] Decode batch, #running-req: 3",
        "[2026-01-01 00:00:02 TP0] Prefill batch, #new-seq: 1",
    ]
    real = Path(__file__).parent / "data" / "logs" / "20-sglang-11854-h20-pd-decode-healthy.log"
    rank_log(str(real), "DP3", out)
    (line,) = out.read_text(encoding="utf-8").splitlines()
    assert line.startswith("2025-10-20 03:02:22 INFO 31223 [TP3 EP3 scheduler_metrics_mixin.py:222] Decode")

"""`kvadmit bench` end to end against a real `kvadmit serve` (the simulated GPU and a tiny real model),
for every backend: the request count, the token totals and the bodies the server received. Expected
numbers come from bench_serving's definitions (lengths drawn with numpy's legacy generator)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvadmit.bench import run as bench_run
from kvadmit.cli import main
from kvadmit.sim.replay import load_replay
from server_helpers import RunningServer, running_server, wait_idle, write_cost_model, write_tiny_model

BACKENDS = ("sglang", "sglang-native", "sglang-oai", "sglang-oai-chat", "vllm", "vllm-chat")
PATHS = {
    "sglang": "/generate",
    "sglang-native": "/generate",
    "sglang-oai": "/v1/completions",
    "vllm": "/v1/completions",
    "sglang-oai-chat": "/v1/chat/completions",
    "vllm-chat": "/v1/chat/completions",
}


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_run, "PAUSE_AFTER_WARMUP_S", 0.0)


@pytest.fixture(scope="module")
def seen() -> list[tuple[str, Any]]:
    return []


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory, seen: list[tuple[str, Any]]) -> Iterator[RunningServer]:
    cost = write_cost_model(tmp_path_factory.mktemp("bench-sim") / "cost.json", decode_ms=1.0)
    with running_server(["--simulate", cost, "--enable-metrics"], seen) as s:
        yield s


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, seen: list[tuple[str, Any]]) -> Iterator[RunningServer]:
    folder = write_tiny_model(tmp_path_factory.mktemp("bench-tiny"))
    argv = ["--model-path", str(folder), "--max-total-tokens", "4096", "--dtype", "float32"]
    with running_server(argv, seen) as s:
        yield s


def bench(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, dict[str, str], str]:
    """Run `kvadmit bench` in this process: (exit status, summary rows by label, stderr)."""
    capsys.readouterr()
    rc = main(["bench", "--base-url", url, "--disable-tqdm", "--ready-check-timeout-sec", "5", *args])
    cap = capsys.readouterr()
    rows = {}
    for line in cap.out.splitlines():
        if ":" in line and not line.startswith(("=", "-")):
            label, _, value = line.partition(":")
            rows[label.strip()] = value.strip()
    return rc, rows, cap.err


def drawn(
    seed: int, n: int, input_len: int, output_len: int, ratio: float = 0.0
) -> tuple[list[int], list[int]]:
    """bench_serving's random lengths: randint(max(int(L × ratio), 1), L + 1), inputs then outputs."""
    rng = np.random.RandomState(seed)
    ins = rng.randint(max(int(input_len * ratio), 1), input_len + 1, size=n).tolist()
    outs = rng.randint(max(int(output_len * ratio), 1), output_len + 1, size=n).tolist()
    return ins, outs


def budget(path: str, body: dict[str, Any]) -> tuple[int, bool]:
    """(token budget, ignore_eos) where each API keeps them."""
    if path == "/generate":
        sp = body["sampling_params"]
        return sp["max_new_tokens"], sp["ignore_eos"]
    key = "max_tokens" if path == "/v1/completions" else "max_completion_tokens"
    return body[key], body["ignore_eos"]


def served(srv: RunningServer) -> tuple[float, float]:
    """(requests ended, tokens generated) by the server's Prometheus counters."""
    text = httpx.get(f"{srv.url}/metrics").text
    totals = {"sglang:num_requests_total": 0.0, "sglang:generation_tokens_total": 0.0}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals["sglang:num_requests_total"], totals["sglang:generation_tokens_total"]


def served_after(srv: RunningServer, requests: float) -> float:
    """Tokens generated once `requests` have ended (a request's counters move just after its answer)."""
    deadline = time.monotonic() + 10
    while (now := served(srv))[0] < requests and time.monotonic() < deadline:
        time.sleep(0.02)
    return now[1]


RANDOM_IDS = [
    "--dataset-name",
    "random-ids",
    "--num-prompts",
    "6",
    "--random-input-len",
    "40",
    "--random-output-len",
    "12",
    "--seed",
    "9",
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_against_the_simulated_gpu(
    backend: str, sim: RunningServer, seen: list[tuple[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    seen.clear()
    rc, rows, _ = bench(capsys, sim.url, "--backend", backend, *RANDOM_IDS)
    ins, outs = drawn(9, 6, 40, 12)
    assert rc == 0
    assert rows["Backend"] == backend
    assert rows["Successful requests"] == "6"
    assert int(rows["Total input tokens"]) == sum(ins)
    assert int(rows["Total generated tokens"]) == sum(outs)  # ignore_eos: each runs to its budget
    assert int(rows["Total generated tokens (retokenized)"]) == sum(outs)  # one byte token each
    assert {path for path, _ in seen} == {PATHS[backend]}
    budgets = [budget(path, body) for path, body in seen]
    assert budgets[0] == (min(outs[0], 32), True)  # the warm-up: the first prompt, at most 32 tokens
    assert sorted(budgets[1:]) == sorted((n, True) for n in outs)
    for _, body in seen:
        prompt = body.get("text", body.get("prompt"))
        if prompt is None:
            assert body["messages"][0]["role"] == "user"
            prompt = body["messages"][0]["content"]
        assert isinstance(prompt, str)  # random-ids goes out as text unless --tokenize-prompt
    wait_idle(sim)


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_without_ignore_eos_output_counts_are_the_servers(
    backend: str, sim: RunningServer, seen: list[tuple[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    seen.clear()
    wait_idle(sim)
    ended, before = served(sim)
    args = ["--backend", backend, "--disable-ignore-eos", "--warmup-requests", "0", *RANDOM_IDS]
    rc, rows, _ = bench(capsys, sim.url, *args)
    assert rc == 0 and rows["Successful requests"] == "6"
    # The simulated GPU stops each request at a length of its own choosing; the totals are what it
    # reported (its Prometheus counter), not the budgets asked for.
    assert int(rows["Total generated tokens"]) == served_after(sim, ended + 6) - before
    assert all(budget(path, body)[1] is False for path, body in seen)
    wait_idle(sim)


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_without_streaming_ttft_is_the_whole_latency(
    backend: str, sim: RunningServer, seen: list[tuple[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    seen.clear()
    rc, rows, _ = bench(capsys, sim.url, "--backend", backend, "--disable-stream", *RANDOM_IDS)
    _, outs = drawn(9, 6, 40, 12)
    assert rc == 0 and rows["Successful requests"] == "6"
    assert int(rows["Total generated tokens"]) == sum(outs)
    assert rows["Mean TTFT (ms)"] == rows["Mean E2E Latency (ms)"]
    assert rows["Max ITL (ms)"] == "0.00"  # no chunks, no gaps
    assert all(body["stream"] is False and "stream_options" not in body for _, body in seen)
    wait_idle(sim)


def test_generated_shared_prefix_prompts_share_the_cache(
    sim: RunningServer, seen: list[tuple[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    seen.clear()
    args = [
        "--dataset-name",
        "generated-shared-prefix",
        "--gsp-num-groups",
        "2",
        "--gsp-prompts-per-group",
        "3",
        "--gsp-system-prompt-len",
        "64",
        "--gsp-question-len",
        "8",
        "--gsp-output-len",
        "5",
    ]
    rc, rows, _ = bench(capsys, sim.url, *args)
    assert rc == 0 and rows["Successful requests"] == "6"
    assert int(rows["Total generated tokens"]) == 6 * 5
    texts = [body["text"] for _, body in seen[1:]]
    # the recorded input counts are the prompts' byte-token counts (the server's tokenizer)
    assert int(rows["Total input tokens"]) == sum(len(t.encode()) for t in texts)
    assert len({t.split("\n\n")[0] for t in texts}) <= 2
    wait_idle(sim)


def test_failed_requests_are_counted_and_the_first_errors_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=1.0)
    with running_server(["--simulate", cost, "--context-length", "48"]) as srv:
        args = [
            "--dataset-name",
            "random-ids",
            "--num-prompts",
            "20",
            "--random-input-len",
            "40",
            "--random-output-len",
            "20",
            "--seed",
            "4",
            "--tokenize-prompt",
            "--warmup-requests",
            "0",
        ]
        rc, rows, err = bench(capsys, srv.url, *args)
    ins, outs = drawn(4, 20, 40, 20)
    too_long = sum(1 for i, o in zip(ins, outs, strict=True) if i + o >= 48)  # prompt + budget ≥ context
    assert 0 < too_long < 20
    assert rc == 0
    assert rows["Successful requests"] == str(20 - too_long)
    assert f"{too_long} of 20 requests failed; the first errors:" in err
    assert "HTTP 400: " in err and "context length of 48 tokens" in err


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_against_the_tiny_model(
    backend: str, tiny: RunningServer, seen: list[tuple[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    seen.clear()
    args = [
        "--backend",
        backend,
        "--dataset-name",
        "random",
        "--num-prompts",
        "4",
        "--random-input-len",
        "30",
        "--random-output-len",
        "6",
        "--seed",
        "2",
    ]
    rc, rows, _ = bench(capsys, tiny.url, *args)
    ins, outs = drawn(2, 4, 30, 6)
    assert rc == 0
    assert rows["Successful requests"] == "4"
    assert int(rows["Total input tokens"]) == sum(ins)  # the tiny tokenizer adds no special token
    assert int(rows["Total generated tokens"]) == sum(outs)
    assert sorted(budget(p, b) for p, b in seen[1:]) == sorted((n, True) for n in outs)
    wait_idle(tiny)


def test_token_id_prompts_go_out_as_drawn(
    tiny: RunningServer, seen: list[tuple[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(
        httpx.get(f"{tiny.url}/model_info").json()["tokenizer_path"]
    ).vocab_size
    seen.clear()
    args = [
        "--dataset-name",
        "random-ids",
        "--tokenize-prompt",
        "--num-prompts",
        "5",
        "--random-input-len",
        "20",
        "--random-output-len",
        "4",
        "--seed",
        "11",
    ]
    rc, rows, _ = bench(capsys, tiny.url, *args)
    assert rc == 0 and rows["Successful requests"] == "5"
    rng = np.random.RandomState(11)
    ins = rng.randint(1, 21, size=5)
    rng.randint(1, 5, size=5)
    offsets = rng.randint(0, vocab, size=5)  # token j of prompt i: (offset_i + i + j) mod vocab
    sent = [body["input_ids"] for _, body in seen[1:]]
    assert sent == [[int((offsets[i] + i + j) % vocab) for j in range(ins[i])] for i in range(5)]
    wait_idle(tiny)


def test_the_output_file_gets_one_line_per_run_with_bench_serving_fields(
    sim: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs.jsonl"
    args = [
        "--dataset-name",
        "random-ids",
        "--num-prompts",
        "5",
        "--random-input-len",
        "20",
        "--random-output-len",
        "4",
        "--seed",
        "11",
        "--output-file",
        str(out),
        "--output-details",
    ]
    for _ in range(2):
        rc, rows, _ = bench(capsys, sim.url, *args)
        assert rc == 0
    ins, outs = drawn(11, 5, 20, 4)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 2
    rec = lines[-1]
    assert rec["backend"] == "sglang" and rec["dataset_name"] == "random-ids"
    assert (rec["completed"], rec["total_input_tokens"], rec["total_output_tokens"]) == (
        5,
        sum(ins),
        sum(outs),
    )
    assert rec["request_rate"] == float("inf") and rec["max_concurrency"] is None
    for key, label in (
        ("mean_ttft_ms", "Mean TTFT (ms)"),
        ("p99_itl_ms", "P99 ITL (ms)"),
        ("concurrency", "Concurrency"),
    ):
        assert rec[key] == pytest.approx(float(rows[label]), abs=0.006)
    assert rec["input_lens"] == ins and rec["output_lens"] == outs
    assert [len(x) for x in rec["itls"]] == [
        n - 1 for n in outs
    ]  # one token a chunk: one gap per later token
    assert rec["server_info"]["max_total_tokens"] == 200_000
    assert rec["errors"] == [""] * 5


def test_a_bench_details_file_replays_in_the_simulator_request_by_request(
    sim: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "details.jsonl"
    rc, _, _ = bench(capsys, sim.url, "--dataset-name", "random-ids", "--num-prompts", "6",
                     "--random-input-len", "24", "--random-output-len", "12", "--seed", "3",
                     "--request-rate", "50", "--disable-ignore-eos", "--output-file", str(out),
                     "--output-details")  # fmt: skip
    assert rc == 0
    rec = json.loads(out.read_text())
    ins, outs = drawn(3, 6, 24, 12)
    assert rec["max_new_tokens"] == outs and rec["ignore_eos"] == [False] * 6
    replay = load_replay(str(out))
    # Each request at its send time, with its prompt, its budget and where the server stopped it.
    order = sorted(range(6), key=lambda i: rec["arrival_times"][i])
    assert list(replay.arrivals) == [rec["arrival_times"][i] for i in order]
    assert all(a <= s for a, s in zip(rec["arrival_times"], rec["start_times"], strict=True))
    assert replay.max_concurrency is None
    assert [(r.prompt_len, r.max_new_tokens, r.true_output_len, r.ignore_eos) for r in replay.requests] == [
        (ins[i], outs[i], rec["output_lens"][i], False) for i in order]  # fmt: skip
    trace = tmp_path / "replayed.jsonl"
    capsys.readouterr()
    argv = ["simulate", "--replay", str(out), "--max-total-tokens", "4096", "--trace-requests", str(trace)]
    assert main([*argv, "--quiet"]) == 0
    replayed = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [r["output_len"] for r in replayed] == [rec["output_lens"][i] for i in order]


def test_arrivals_follow_the_seeded_poisson_gaps_and_concurrency_stays_capped(
    sim: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d.jsonl"
    common = [
        "--dataset-name",
        "random-ids",
        "--num-prompts",
        "8",
        "--random-input-len",
        "16",
        "--random-output-len",
        "8",
        "--seed",
        "5",
        "--output-file",
        str(out),
        "--output-details",
    ]
    rc, rows, _ = bench(capsys, sim.url, *common, "--request-rate", "20")
    assert rc == 0 and rows["Traffic request rate"] == "20.0"
    rng = np.random.RandomState(5)
    rng.randint(1, 17, size=8), rng.randint(1, 9, size=8), rng.randint(0, 257, size=8)  # the dataset's draws
    gaps = [rng.exponential(1 / 20) for _ in range(7)]
    starts = json.loads(out.read_text().splitlines()[-1])["start_times"]
    for i, gap in enumerate(gaps):  # each request waits at least its gap after the one before
        assert starts[i + 1] - starts[i] >= gap - 0.002
    assert starts[-1] - starts[0] < sum(gaps) + 0.5

    rc, rows, _ = bench(capsys, sim.url, *common, "--max-concurrency", "2")
    assert rc == 0 and rows["Max request concurrency"] == "2"
    rec = json.loads(out.read_text().splitlines()[-1])
    spans = [(s, s + lat) for s, lat in zip(rec["start_times"], rec["latencies"], strict=True)]
    for s, _ in spans:  # at any send, at most one other request is still open
        assert sum(1 for a, b in spans if a < s < b) <= 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_server_gives_one_line_and_exit_status_1(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    rc = main(
        [
            "bench",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dataset-name",
            "random-ids",
            "--ready-check-timeout-sec",
            "0",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert len(err) == 1
    assert err[0].startswith(f"kvadmit bench: error: cannot reach the server at http://127.0.0.1:{port}: ")


def test_ctrl_c_prints_the_summary_of_what_finished(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "slow.json", decode_ms=20.0)
    got: list[tuple[str, Any]] = []
    with running_server(["--simulate", cost], got) as srv:
        cmd = [
            sys.executable,
            "-m",
            "kvadmit",
            "bench",
            "--base-url",
            srv.url,
            "--dataset-name",
            "random-ids",
            "--num-prompts",
            "30",
            "--random-input-len",
            "16",
            "--random-output-len",
            "10",
            "--random-range-ratio",
            "1",
            "--max-concurrency",
            "1",
            "--warmup-requests",
            "0",
            "--disable-tqdm",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while len(got) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)  # a request takes ≈ 0.2 s: let three finish
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    finished = int(next(x for x in stdout.splitlines() if x.startswith("Successful requests:")).split()[-1])
    assert 1 <= finished < 30
    assert f"interrupted: {finished} of 30 requests finished" in stderr
    assert "Serving Benchmark Result" in stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-prompts", "0"], "--num-prompts must be positive"),
        (["--max-concurrency", "0"], "--max-concurrency must be a positive integer"),
        (["--request-rate", "0"], "--request-rate must be > 0"),
        (["--extra-request-body", "{oops"], "--extra-request-body is not JSON"),
        (["--extra-request-body", "[1]"], "--extra-request-body must be a JSON object"),
        ([], "--dataset-name sharegpt (the default) needs --dataset-path"),
        (["--dataset-name", "random", "--tokenize-prompt"], "--tokenize-prompt works with"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--port", str(free_port()), "--ready-check-timeout-sec", "0"]
    if "--dataset-name" not in args and args:
        argv += ["--dataset-name", "random-ids"]
    rc = main([*argv, *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and message in err[0]

"""Prometheus text: gauges as one look at the scheduler, counters read twice for a rate, the
num_retracted_reqs pitfall, and --watch against a live endpoint."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvadmit.cli import main
from kvadmit.doctor import prom
from kvadmit.doctor.diagnose import Inputs, diagnose
from kvadmit.doctor.watch import metrics_url

LABELS = 'engine_type="unified",model_name="Qwen/Qwen3-4B",moe_ep_rank="0",pp_rank="0",tp_rank="0"'


def scrape(
    retracted_total: float, running: int = 40, queued: int = 12, usage: float = 0.93, gauge: float = 0.0
) -> str:
    return "\n".join(
        [
            "# HELP sglang:num_running_reqs The number of running requests.",
            "# TYPE sglang:num_running_reqs gauge",
            f"sglang:num_running_reqs{{{LABELS}}} {running}.0",
            "# TYPE sglang:num_queue_reqs gauge",
            f"sglang:num_queue_reqs{{{LABELS}}} {queued}.0",
            "# TYPE sglang:token_usage gauge",
            f"sglang:token_usage{{{LABELS}}} {usage}",
            "# TYPE sglang:num_retracted_reqs gauge",
            f"sglang:num_retracted_reqs{{{LABELS}}} {gauge}",
            "# HELP sglang:num_retracted_requests_total Retracted requests.",
            "# TYPE sglang:num_retracted_requests_total counter",
            f"sglang:num_retracted_requests_total{{{LABELS}}} {retracted_total}",
            "",
        ]
    )


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_the_strict_parser_reads_sglang_text_and_sums_data_parallel_ranks() -> None:
    text = scrape(5) + f'sglang:num_queue_reqs{{{LABELS},dp_rank="1"}} 8.0\n'
    s = prom.parse_text(text, "x")
    assert not s.lenient
    assert s.value(prom.RUNNING) == 40 and s.value(prom.RETRACTED_COUNTER) == 5
    assert s.value(prom.QUEUED) == 12 + 8  # two data-parallel schedulers each have a queue


def test_thirty_retractions_a_minute_between_two_scrapes_is_a_storm(tmp_path: Path) -> None:
    a, b = write(tmp_path, "a.prom", scrape(10)), write(tmp_path, "b.prom", scrape(40))
    d = diagnose(Inputs(metrics=[a, b], interval_s=60.0))
    assert d.verdict == "retraction-storm"
    assert d.lead.numbers == {"increase": 30.0, "seconds": 60.0}
    assert "30 retractions per minute" in d.lead.title


def test_one_retraction_in_ten_minutes_is_occasional(tmp_path: Path) -> None:
    a, b = write(tmp_path, "a.prom", scrape(10)), write(tmp_path, "b.prom", scrape(11))
    d = diagnose(Inputs(metrics=[a, b], interval_s=600.0))
    assert any(f.verdict == "retraction-occasional" for f in d.findings)
    assert not any(f.verdict == "retraction-storm" for f in d.findings)


def test_without_an_interval_the_files_modification_times_are_used(tmp_path: Path) -> None:
    a, b = write(tmp_path, "a.prom", scrape(0)), write(tmp_path, "b.prom", scrape(6))
    os.utime(a, (1_000_000, 1_000_000))
    os.utime(b, (1_000_120, 1_000_120))
    d = diagnose(Inputs(metrics=[a, b]))
    storm = next(f for f in d.findings if f.verdict in ("retraction-storm", "retraction-occasional"))
    assert storm.numbers == {"increase": 6.0, "seconds": 120.0}


def test_the_reset_gauge_is_explained_and_the_counter_recommended(tmp_path: Path) -> None:
    d = diagnose(Inputs(metrics=[write(tmp_path, "one.prom", scrape(3, gauge=0.0))]))
    note = next(f for f in d.findings if f.kind == "metrics-pitfall")
    text = " ".join(note.explanation)
    assert "reset to 0" in text and "sglang:num_retracted_requests_total" in text
    assert any("sglang:num_retracted_reqs{" in q.text for q in note.evidence)


def test_a_scrape_with_a_queue_beside_a_full_pool_is_a_healthy_queue(tmp_path: Path) -> None:
    d = diagnose(Inputs(metrics=[write(tmp_path, "one.prom", scrape(0))]))
    assert d.verdict == "healthy-queue"
    assert any("sglang:num_queue_reqs{" in q.text for q in d.lead.evidence)


def test_a_queue_beside_an_empty_pool_from_metrics_is_an_idle_pool(tmp_path: Path) -> None:
    d = diagnose(Inputs(metrics=[write(tmp_path, "one.prom", scrape(0, running=10, queued=50, usage=0.2))]))
    assert d.verdict == "idle-pool-with-queue"


def test_text_that_is_not_prometheus_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "log.txt", "[2026-01-01 00:00:00] hello\nnot metrics\n")
    assert main(["doctor", "--metrics", path]) == 2
    assert "not Prometheus text" in capsys.readouterr().err


class _Server:
    """A /metrics endpoint whose retraction counter grows by 3 at every scrape."""

    def __init__(self) -> None:
        self.count = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                if self.path != "/metrics":
                    body, status, kind = b"<html>hello</html>", 200, "text/html"
                else:
                    body, status, kind = scrape(outer.count).encode(), 200, "text/plain"
                    outer.count += 3
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def test_watch_scrapes_a_live_server_for_a_rate(server: _Server, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--watch", f"127.0.0.1:{server.port}", "--for", "1", "--every", "0.5", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert server.count >= 9  # at 0, 0.5 and 1 s
    rate = next(f for f in out["findings"] if f["kind"] in ("retraction-storm", "retraction-occasional"))
    assert rate["numbers"]["increase"] == server.count - 3  # first to last scrape
    assert out["verdict"] == "retraction-storm"


def test_watch_errors_are_one_line(server: _Server, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--watch", f"http://127.0.0.1:{server.port}/other", "--for", "1"]) == 2
    assert "no Prometheus metrics" in capsys.readouterr().err
    assert main(["doctor", "--watch", "http://127.0.0.1:1/metrics", "--for", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvadmit doctor: error: cannot scrape") and err.count("\n") == 1


def test_metrics_urls() -> None:
    assert metrics_url("localhost:30000") == "http://localhost:30000/metrics"
    assert metrics_url("http://gpu7:8000/") == "http://gpu7:8000/metrics"
    assert metrics_url("https://x/custom/metrics") == "https://x/custom/metrics"

"""A `python -m sglang.launch_server` line pasted into `kvadmit serve` (or `python -m kvadmit.launch_server`):
it builds the same server as kvadmit's own spelling, the start-up log names the flags with no effect once,
and SGLang's --config FILE works with the command line overriding the file."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from kvadmit.cli import main
from kvadmit.config import SchedulerKnobs, ServerArgs
from kvadmit.errors import UsageError

PASTED = [
    "--model-path", "X", "--trust-remote-code", "--tp-size", "1", "--mem-fraction-static", "0.8",
    "--kv-cache-dtype", "auto", "--enable-metrics", "--log-requests", "--schedule-policy", "lpm",
    "--chunked-prefill-size", "4096", "--max-running-requests", "64",
]  # fmt: skip
NATIVE = [
    "--model-path", "X", "--mem-fraction-static", "0.8", "--enable-metrics", "--schedule-policy", "lpm",
    "--chunked-prefill-size", "4096", "--max-running-requests", "64",
]  # fmt: skip
NO_EFFECT_LINE = "accepted, no effect here: --trust-remote-code, --tp-size, --log-requests"


class _Served:
    def __init__(self) -> None:
        self.ns: argparse.Namespace | None = None
        self.args: ServerArgs | None = None

    def __call__(self, ns: argparse.Namespace, args: ServerArgs) -> int:
        self.ns, self.args = ns, args
        return 0


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> _Served:
    import kvadmit.server.main

    capture = _Served()
    monkeypatch.setattr(kvadmit.server.main, "serve", capture)
    return capture


def _serve(served: _Served, argv: list[str]) -> tuple[argparse.Namespace, ServerArgs]:
    assert main(["serve", *argv]) == 0
    assert served.ns is not None and served.args is not None
    return served.ns, served.args


def test_a_pasted_launch_line_builds_the_native_server(served: _Served) -> None:
    ns, args = _serve(served, PASTED)
    expected = ServerArgs(
        schedule_policy="lpm", chunked_prefill_size=4096, max_running_requests=64,
        knobs=SchedulerKnobs.from_environ(),
    )  # fmt: skip
    assert args == expected
    assert (ns.model_path, ns.mem_fraction_static, ns.enable_metrics) == ("X", 0.8, True)
    assert ns.startup_notes == [NO_EFFECT_LINE, LOOP_LINE]
    native_ns, native_args = _serve(served, NATIVE)
    assert native_args == args
    assert native_ns.startup_notes == [LOOP_LINE]
    for key in ("model_path", "mem_fraction_static", "enable_metrics", "dtype", "host", "port"):
        assert getattr(native_ns, key) == getattr(ns, key), key


def test_sglang_names_for_dtypes_and_token_counts(served: _Served) -> None:
    ns, args = _serve(served, ["--model", "m", "--dtype", "half", "--max-total-tokens", "8k",
                               "--max-prefill-tokens", "2Ki"])  # fmt: skip
    assert (ns.model_path, ns.dtype) == ("m", "float16")
    assert (args.max_total_tokens, args.max_prefill_tokens) == (8000, 2048)
    assert _serve(served, ["--dtype", "float"])[0].dtype == "float32"


def test_the_overlap_loop_is_the_default_and_the_flag_selects_the_other(served: _Served) -> None:
    ns, args = _serve(served, ["--disable-overlap-schedule"])
    assert ns.startup_notes == [
        LOOP_LINE.replace(
            "the overlap event loop (SGLang's default; --disable-overlap-schedule for the other)",
            "the non-overlap event loop (--disable-overlap-schedule)",
        )
    ]
    assert args == ServerArgs(knobs=SchedulerKnobs.from_environ(), disable_overlap_schedule=True)
    assert _serve(served, [])[1].disable_overlap_schedule is False  # SGLang's default loop


def test_sglangs_priority_flags_are_the_schedulers(served: _Served) -> None:
    flags = [
        "--enable-priority-scheduling", "--schedule-low-priority-values-first",
        "--default-priority-value", "-3", "--priority-scheduling-preemption-threshold", "4",
        "--retraction-policy", "priority",
    ]  # fmt: skip
    ns, args = _serve(served, [*flags, "--disable-overlap-schedule"])
    assert ns.startup_notes == [NON_OVERLAP_LINE]  # no "no effect" note
    assert args == ServerArgs(
        enable_priority_scheduling=True, schedule_low_priority_values_first=True, default_priority_value=-3,
        priority_scheduling_preemption_threshold=4, retraction_policy="priority",
        knobs=SchedulerKnobs.from_environ(), disable_overlap_schedule=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pp-size", "2"], "--pp-size 2: kvadmit runs one scheduler on one device"),
        (["--radix-eviction-policy", "priority"], "--radix-eviction-policy priority: kvadmit models the GPU"),
        (["--tp-size", "2"], "--tp-size 2: kvadmit runs one scheduler on one device"),
        (["--dp-size", "2"], "--dp-size 2: kvadmit runs one scheduler on one device"),
        (["--speculative-algorithm", "EAGLE"], "--speculative-algorithm EAGLE: kvadmit does not model spec"),
        (["--disaggregation-mode", "prefill"], "--disaggregation-mode prefill: kvadmit does not model"),
        (["--enable-dp-attention"], "--enable-dp-attention: kvadmit runs one scheduler"),
        (["--swa-full-tokens-ratio", "0.5"], "--swa-full-tokens-ratio 0.5: kvadmit models one"),
        (["--schedule-policy", "priority"], "--schedule-policy priority: SGLang 0.5.22's parser takes it"),
        (["--schedule-policy", "hrrn"], "--schedule-policy hrrn: kvadmit models SGLang's fcfs"),
    ],
)
def test_a_refused_kind_is_one_line_and_exit_2(
    served: _Served, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvadmit serve: error: " + message) and err.count("\n") == 1, err
    assert served.ns is None


def test_config_file_with_the_command_line_overriding_it(served: _Served, tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(
        "max-running-requests: 32\nschedule_policy: lpm\nenable-metrics: true\ndisable-radix-cache: false\n"
        "trust-remote-code: true\nextra-metric-labels: {team: a}\n"
    )
    ns, args = _serve(served, ["--max-running-requests", "64", "--config", str(config), "--port", "31000"])
    assert args.max_running_requests == 64  # the command line wins, before or after --config
    assert args.schedule_policy == "lpm" and args.disable_radix_cache is False
    assert (ns.enable_metrics, ns.port) == (True, 31000)
    assert ns.startup_notes[0] == "accepted, no effect here: --trust-remote-code, --extra-metric-labels"
    json_config = tmp_path / "server.json"
    json_config.write_text('{"max_running_requests": 16, "page_size": 4}')
    _, args = _serve(served, [f"--config={json_config}", "--page-size", "2"])
    assert (args.max_running_requests, args.page_size) == (16, 2)


@pytest.mark.parametrize(
    ("text", "name", "message"),
    [
        ("no-such-flag: 1\n", "c.yaml", "'no-such-flag' is not a flag of kvadmit serve"),
        ("- a\n", "c.yaml", "must hold a mapping of flag: value"),
        ("max-running-requests: 1\n", "c.txt", "must be a YAML (.yaml, .yml) or JSON (.json) file"),
        ("enable-metrics: 3\n", "c.yml", "enable-metrics takes true or false, got 3"),
    ],
)
def test_a_bad_config_file_is_one_line_and_exit_2(
    served: _Served, capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, name: str, message: str
) -> None:
    (tmp_path / name).write_text(text)
    assert main(["serve", "--config", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvadmit serve: error: --config ") and message in err and err.count("\n") == 1, err


def test_config_given_twice_is_refused(served: _Served, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", "a.yaml", "--config", "b.yaml"]) == 2
    assert "only one config file" in capsys.readouterr().err


@pytest.fixture
def kvadmit_logger() -> Iterator[None]:
    """serve sets up the "kvadmit" logger's handlers: put them back for the tests after this one."""
    logger = logging.getLogger("kvadmit")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    for handler in logger.handlers:
        if handler not in saved[0]:
            handler.close()
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def test_the_start_up_log_names_the_no_effect_flags_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kvadmit_logger: None
) -> None:
    import kvadmit.server.main

    def stop(ns: argparse.Namespace, args: ServerArgs) -> None:
        raise UsageError("stopped before the engine")

    monkeypatch.setattr(kvadmit.server.main, "build_state", stop)
    log = tmp_path / "server.log"
    assert main(["serve", *PASTED, "--log-file", str(log)]) == 2
    lines = log.read_text().splitlines()
    assert lines == [NO_EFFECT_LINE, LOOP_LINE]


LOOP_LINE = "Scheduling as SGLang 0.5.22 with the overlap event loop (SGLang's default; --disable-overlap-schedule for the other)"  # noqa: E501


NON_OVERLAP_LINE = "Scheduling as SGLang 0.5.22 with the non-overlap event loop (--disable-overlap-schedule)"


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_python_m_kvadmit_launch_server_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvadmit.launch_server", "--help"], capture_output=True, text=True,
        env=_env(), timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "--config FILE" in out and "--max-total-tokens" in out and "--schedule-policy" in out


def test_python_m_kvadmit_launch_server_serves_a_pasted_line(tmp_path: Path) -> None:
    cost = tmp_path / "cost.json"
    cost.write_text('{"decode": {"base_ms": 2.0}, "prefill": {"tokens_per_s": 1000000}}')
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvadmit.launch_server", *PASTED, "--simulate", str(cost), "--port", "0",
         "--max-total-tokens", "4096"],
        stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if "fired up" in line:
                break
        assert any("fired up" in line for line in lines), lines
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert lines.count(NO_EFFECT_LINE) == 1
    assert lines.count(LOOP_LINE) == 1
    assert proc.returncode == 0


def test_native_spelling_is_unchanged_by_the_sglang_flags(served: _Served) -> None:
    argv = ["--max-total-tokens", "4096", "--page-size", "4", "--chunked-prefill-size", "64"]
    _, args = _serve(served, argv)
    assert args == replace(
        ServerArgs(knobs=SchedulerKnobs.from_environ()), max_total_tokens=4096, page_size=4,
        chunked_prefill_size=64,
    )  # fmt: skip

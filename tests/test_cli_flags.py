"""The command line's flags against the config dataclasses they fill: one default, in the dataclass."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

import pytest

from kvadmit.cli import build_parser, server_args_from
from kvadmit.config import SIMULATED_CONTEXT_LENGTH, SchedulerKnobs, ServerArgs


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings}


SERVER_FIELDS = {f.name: f for f in fields(ServerArgs) if f.name != "knobs"}
# sweep takes lists of these (its own flags, default None: "not swept")
SWEPT = {"schedule_conservativeness", "max_running_requests", "max_total_tokens", "chunked_prefill_size",
         "admission_policy"}  # fmt: skip


# Flags with a server argument's name that are not the server group's: calibrate's is the interval of the
# log it reads; generate's pool is the offline engine's own (16384 tokens, not sized by memory).
OWN_DEFAULTS = {("calibrate", "decode_log_interval"), ("generate", "max_total_tokens")}


def test_every_server_flag_defaults_to_the_dataclass_default() -> None:
    checked = 0
    for name, parser in _commands().items():
        for dest, action in _flags(parser).items():
            if dest not in SERVER_FIELDS or (name == "sweep" and dest in SWEPT):
                continue
            if (name, dest) in OWN_DEFAULTS:
                continue
            f = SERVER_FIELDS[dest]
            assert f.default is not MISSING
            assert action.default == f.default, (name, dest)
            assert action.option_strings == ["--" + dest.replace("_", "-")], (name, dest)
            checked += 1
    # 23 server flags (ServerArgs less knobs and admission_policy) in capacity; simulate and serve add
    # --admission-policy (24 each); sweep has those 24 less its 5 swept ones: 23 + 24 + 24 + 19
    assert checked == 90


@pytest.mark.parametrize("command", ["capacity", "simulate", "serve", "sweep"])
def test_the_server_group_has_a_flag_for_every_server_argument(command: str) -> None:
    flags = _flags(_commands()[command])
    missing = set(SERVER_FIELDS) - {"admission_policy"} - set(flags)
    assert not missing
    if command != "capacity":  # capacity asks about SGLang's admission only
        assert "admission_policy" in flags


def test_no_flags_give_the_dataclass_defaults() -> None:
    ns = build_parser().parse_args(["serve"])
    assert server_args_from(ns) == ServerArgs(knobs=SchedulerKnobs.from_environ())
    ns = build_parser().parse_args(["simulate", "--page-size", "4", "--disable-radix-cache"])
    assert server_args_from(ns) == ServerArgs(page_size=4, disable_radix_cache=True)


def test_a_server_flag_reads_the_dataclass_type(capsys: pytest.CaptureFixture[str]) -> None:
    ns = build_parser().parse_args(
        ["capacity", "--schedule-conservativeness", "0.5", "--context-length", "9"]
    )
    assert ns.schedule_conservativeness == 0.5 and ns.context_length == 9
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["capacity", "--page-size", "two"])
    assert e.value.code == 2
    assert "argument --page-size: invalid int value: 'two'" in capsys.readouterr().err


def test_simulate_without_workload_flags_is_the_dataclass_defaults() -> None:
    from kvadmit.bench.workload import WorkloadSpec
    from kvadmit.cli.simulate import simulate_config
    from kvadmit.sim.run import SimConfig

    cfg = simulate_config(build_parser().parse_args(["simulate", "--max-total-tokens", "1000"]))
    assert cfg.workload == WorkloadSpec()
    d = {f.name: f.default for f in fields(SimConfig) if f.default is not MISSING}
    assert (cfg.request_rate, cfg.max_concurrency, cfg.warmup_requests, cfg.backend) == (
        d["request_rate"], d["max_concurrency"], d["warmup_requests"], d["backend"],
    )  # fmt: skip
    # without --context-length and without a model: the one simulated context length
    assert cfg.context_len == d["context_len"] == SIMULATED_CONTEXT_LENGTH == 32768

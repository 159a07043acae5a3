"""SGLang 0.5.22's launch flags: the committed list (src/kvadmit/cli/sglang_flags_0_5_22.json) is complete in
kvadmit's tables, every flag parses under each of its names, and each refused one is refused."""

from __future__ import annotations

import argparse
import json
from importlib import resources

import pytest

from kvadmit.cli import build_parser, main
from kvadmit.cli.sglang_compat import COMPAT_PREFIX
from kvadmit.cli.sglang_flags import SglangFlag, human_readable_int, sglang_flags
from kvadmit.cli.sglang_no_effect import NO_EFFECT
from kvadmit.cli.sglang_treatment import IMPLEMENTED, REFUSED


def _serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def test_the_list_is_sglang_0_5_22s_521_flags() -> None:
    data = json.loads(resources.files("kvadmit.cli").joinpath("sglang_flags_0_5_22.json").read_text())
    assert data["sglang_version"] == "0.5.22"
    flags = sglang_flags()
    assert len(flags) == 521
    names = [n for f in flags for n in f.names]
    assert len(names) == len(set(names)) == 544  # 521 flags, 23 more names (aliases and --no- forms)
    assert len({f.dest for f in flags}) == 521
    # spot checks against SGLang 0.5.22's server_args (fields/schedule.py, fields/model.py, parallel.py)
    by_dest = {f.dest: f for f in flags}
    assert by_dest["schedule_policy"].choices == (
        "lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key", "hrrn",
        "shortest-prefill-first",
    )  # fmt: skip
    assert by_dest["schedule_policy"].default == "fcfs"
    assert by_dest["tp_size"].names == ("--tp-size", "--tensor-parallel-size")
    assert by_dest["model_path"].names == ("--model-path", "--model")
    assert by_dest["max_total_tokens"].value == "human_int"
    assert by_dest["trust_remote_code"].action == "store_true"
    assert by_dest["dtype"].choices == ("auto", "half", "float16", "bfloat16", "float", "float32")


def test_every_flag_has_exactly_one_treatment() -> None:
    dests = {f.dest for f in sglang_flags()}
    tables = [set(IMPLEMENTED), set(REFUSED), set(NO_EFFECT)]
    assert len(NO_EFFECT) == len(set(NO_EFFECT))
    for i, a in enumerate(tables):
        assert a <= dests, f"not SGLang 0.5.22 flags: {sorted(a - dests)}"
        for b in tables[i + 1 :]:
            assert not a & b, f"in two tables: {sorted(a & b)}"
    assert set().union(*tables) == dests, f"no treatment: {sorted(dests - set().union(*tables))}"
    assert (len(IMPLEMENTED), len(REFUSED), len(NO_EFFECT)) == (45, 41, 435)


def test_a_refused_flag_accepts_sglangs_default() -> None:
    by_dest = {f.dest: f for f in sglang_flags()}
    for dest, refusal in REFUSED.items():
        default = by_dest[dest].default
        assert default in refusal.allowed, (dest, default, refusal.allowed)


# values of implemented flags that SGLang takes as any text and kvadmit checks
_SAMPLES: dict[str, tuple[list[str], object]] = {"log_level": (["warning"], "warning")}


def _sample(flag: SglangFlag) -> tuple[list[str], object]:
    """Command-line words after the flag's name that SGLang's parser accepts, and the value they give."""
    if flag.dest in _SAMPLES:
        return _SAMPLES[flag.dest]
    if flag.action in ("store_true", "boolean_optional"):
        return [], True
    if flag.choices:
        choice = flag.choices[-1]
        return [str(choice)], ([choice] if flag.nargs in ("+", "*") else choice)
    words, value = {
        "int": (["7"], 7),
        "float": (["0.5"], 0.5),
        "human_int": (["4k"], 4000),
        "json": (['{"a": [1, 2]}'], {"a": [1, 2]}),
        "str": (["x"], "x"),
    }[flag.value or "str"]
    if flag.nargs in ("+", "*"):
        return [*words, *words], [value, value]
    return words, value


def test_every_name_of_every_flag_parses() -> None:
    serve = _serve_parser()
    dest_of = {name: a.dest for a in serve._actions for name in a.option_strings}
    for flag in sglang_flags():
        if flag.dest == "config":
            continue  # read before parsing (tests/test_launch_line.py)
        words, value = _sample(flag)
        for name in flag.names:
            ns = serve.parse_args([name, *words])
            if name.startswith("--no-") and flag.action == "boolean_optional":
                value_here: object = False
            elif flag.dest == "dtype":
                value_here = {"half": "float16", "float": "float32"}.get(str(value), value)
            else:
                value_here = value
            if flag.dest in IMPLEMENTED:
                assert dest_of[IMPLEMENTED[flag.dest]] == dest_of[name], name
            else:
                assert dest_of[name] == COMPAT_PREFIX + flag.dest, name
            assert getattr(ns, dest_of[name]) == value_here, name


def test_values_take_sglangs_syntax() -> None:
    serve = _serve_parser()
    ns = serve.parse_args(["--tp-size=1", "--max-total-tokens=4Ki", "--context-length", "25.6k",
                           "--extra-metric-labels", '{"team": "a"}', "--model=m"])  # fmt: skip
    assert getattr(ns, COMPAT_PREFIX + "tp_size") == 1
    assert ns.max_total_tokens == 4096
    assert ns.context_length == 25600
    assert getattr(ns, COMPAT_PREFIX + "extra_metric_labels") == {"team": "a"}
    assert ns.model_path == "m"
    assert human_readable_int("2M") == 2_000_000
    with pytest.raises(argparse.ArgumentTypeError, match=r"invalid int value: '1\.5Ki'"):
        human_readable_int("1.5Ki")  # decimals only with SI suffixes, as SGLang


def _refused_value(flag: SglangFlag) -> list[str]:
    refusal = REFUSED[flag.dest]
    if flag.action == "store_true":
        return []
    if flag.choices:
        return [str(next(c for c in flag.choices if c not in refusal.allowed))]
    return {"int": ["2"], "float": ["0.5"], "human_int": ["2"], "json": ['{"a": 1}'], "str": ["x"]}[
        flag.value or "str"
    ]


def test_each_refused_flag_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvadmit.server.main

    monkeypatch.setattr(kvadmit.server.main, "serve", lambda ns, args: pytest.fail("served"))
    for flag in sglang_flags():
        if flag.dest not in REFUSED:
            continue
        assert main(["serve", "--simulate", "x.json", flag.name, *_refused_value(flag)]) == 2, flag.name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"kvadmit serve: error: {flag.name}"), err
        assert REFUSED[flag.dest].reason in err

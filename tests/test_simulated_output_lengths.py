"""`serve --simulate-output-len`: where simulated requests without ignore_eos stop. A length L counts the
end-of-sequence token (it is usage.completion_tokens when the request stops there); the visible text is
the L − 1 tokens before it. uniform draws L in [2, max_new_tokens], fixed:F gives F × max_new_tokens
rounded half up, lognormal:MEAN,SIGMA has mean MEAN, trace:FILE cycles a file's lengths; none gives a lone
EOS unless asked (fixed:0, or a 1 in a trace)."""

from __future__ import annotations

import random
import statistics
from collections import Counter
from pathlib import Path

import httpx
import pytest

from kvadmit.cli import build_parser, server_args_from
from kvadmit.errors import UsageError
from kvadmit.executor.output_lengths import OutputLengthError, parse_output_lengths
from server_helpers import running_server, write_cost_model


def draws(spec: str, max_new_tokens: int, n: int, seed: int = 7) -> list[int]:
    dist, rng = parse_output_lengths(spec), random.Random(seed)
    return [dist.draw(max_new_tokens, rng) for _ in range(n)]


def test_fixed_fraction_gives_exactly_that_length() -> None:
    assert draws("fixed:0.5", 100, 3) == [50, 50, 50]
    assert draws("fixed:0.5", 41, 1) == [21]  # 20.5 rounds half up
    assert draws("fixed:0.25", 10, 1) == [3]  # 2.5 → 3
    assert draws("fixed:1", 64, 1) == [64]  # EOS as the last token allowed (SGLang: finish "length")
    assert draws("fixed:1.5", 10, 1) == [15]  # past max_new_tokens: the request ends by length
    assert draws("fixed:0.01", 100, 1) == [2]  # 1 → at least one visible token
    assert draws("fixed:0", 100, 2) == [1, 1]  # asked for: a lone end-of-sequence token


def test_uniform_covers_two_to_max_new_tokens_and_never_a_lone_eos() -> None:
    counts = Counter(draws("uniform", 10, 9000))
    assert sorted(counts) == list(range(2, 11))  # 9 values, each about 1,000 times
    assert all(800 < c < 1200 for c in counts.values()), counts
    assert draws("uniform", 2, 5) == [2] * 5
    assert draws("uniform", 1, 5) == [2] * 5  # beyond max_new_tokens = 1: one token, by length


def test_lognormal_has_the_mean_asked_for() -> None:
    lengths = draws("lognormal:200,0.5", 100_000, 20_000, seed=11)
    # The standard deviation of a lognormal of mean m is m·sqrt(e^{σ²} − 1) = 200 × 0.533 = 107 tokens, so
    # the mean of 20,000 draws is within 107 / sqrt(20000) = 0.75 tokens of 200 two times in three: ±2%
    # is over five of those.
    assert abs(statistics.fmean(lengths) - 200) < 4
    # the median of a lognormal is m·e^{−σ²/2} = 200 × 0.8825 = 176.5
    assert abs(statistics.median(lengths) - 176.5) < 4
    assert min(draws("lognormal:3,1.5", 1000, 5000)) == 2  # many draws fall below 2: raised to 2


def test_trace_lengths_cycle_in_arrival_order(tmp_path: Path) -> None:
    trace = tmp_path / "lengths.txt"
    trace.write_text('5\n{"rid": "a", "output_len": 7, "true_output_len": 9}\n{"output_len": 0}\n\n'
                     '{"output_len": 4}\n1\n')  # fmt: skip
    # true_output_len wins over output_len; a request that generated nothing is skipped; 1 is kept
    assert draws(f"trace:{trace}", 100, 6) == [5, 9, 4, 1, 5, 9]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gaussian", "--simulate-output-len 'gaussian': expected one of uniform, fixed:F, "
                     "lognormal:MEAN,SIGMA, trace:FILE"),
        ("fixed", "--simulate-output-len 'fixed': expected one of"),
        ("fixed:-0.5", "--simulate-output-len fixed:-0.5: the fraction must be ≥ 0"),
        ("fixed:half", "--simulate-output-len fixed:half: 'half' is not a number"),
        ("fixed:nan", "--simulate-output-len fixed:nan: 'nan' is not a finite number"),
        ("lognormal:200", "--simulate-output-len 'lognormal:200': expected one of"),
        ("lognormal:0.5,1", "--simulate-output-len lognormal:0.5,1: the mean must be ≥ 1 token"),
        ("lognormal:100,0", "the mean must be ≥ 1 token and sigma > 0"),
        ("trace:/no/such/file", "--simulate-output-len trace:/no/such/file: cannot read it"),
    ],
)  # fmt: skip
def test_bad_values_are_one_line(spec: str, message: str) -> None:
    with pytest.raises(OutputLengthError) as e:
        parse_output_lengths(spec)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_trace_lines_name_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.txt"
    for text, message in [
        ("3\nzero\n", "t.txt:2: 'zero' is not an integer"),
        ("0\n", "lengths must be ≥ 1"),
        ("{oops\n", "t.txt:1: not a JSON line"),
        ("\n\n", "the file lists no lengths"),
    ]:
        trace.write_text(text)
        with pytest.raises(OutputLengthError, match=message):
            parse_output_lengths(f"trace:{trace}")


def test_the_flag_needs_simulate_and_a_good_value(tmp_path: Path) -> None:
    from kvadmit.server.main import build_state

    cost = write_cost_model(tmp_path / "cost.json")
    for argv, message in [
        (["--simulate-output-len", "fixed:0.5"], "--simulate-output-len needs --simulate COST_MODEL"),
        (["--simulate", cost, "--simulate-output-len", "fixed:-1"], "the fraction must be ≥ 0"),
    ]:
        ns = build_parser().parse_args(["serve", *argv])
        with pytest.raises(UsageError, match=message):
            build_state(ns, server_args_from(ns))


def _completion(url: str, max_tokens: int, prompt: str = "hello") -> dict:
    body = {"model": "simulated", "prompt": prompt, "max_tokens": max_tokens}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_fixed_fraction_server_answers_that_many_tokens(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=0.5)
    with running_server(["--simulate", cost, "--simulate-output-len", "fixed:0.5"]) as srv:
        out = _completion(srv.url, 40)
        assert out["usage"]["completion_tokens"] == 20
        assert out["choices"][0]["finish_reason"] == "stop"
        assert out["choices"][0]["text"] == "a" * 19  # the byte tokenizer's text token; EOS is not text
        sp = {"max_new_tokens": 41}
        meta = httpx.post(f"{srv.url}/generate", json={"text": "hi", "sampling_params": sp}, timeout=60)
        assert meta.json()["meta_info"]["completion_tokens"] == 21  # 20.5 rounds half up
        ignoring = httpx.post(f"{srv.url}/generate", timeout=60,
                              json={"text": "hi", "sampling_params": {**sp, "ignore_eos": True}})  # fmt: skip
        assert ignoring.json()["meta_info"]["completion_tokens"] == 41
        expected = ("Simulated output lengths (requests without ignore_eos; end-of-sequence token included): "
                    "fixed: 0.5 × max_new_tokens, rounded, at least 2")  # fmt: skip
        assert srv.log_lines.count(expected) == 1


def test_the_default_server_never_answers_empty(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=0.2)
    with running_server(["--simulate", cost]) as srv:
        assert any(line.endswith(": uniform from 2 to max_new_tokens") for line in srv.log_lines)
        seen = Counter()
        for i in range(60):
            out = _completion(srv.url, 1 + i % 3, prompt=f"request {i}")
            text, usage = out["choices"][0]["text"], out["usage"]
            assert text, out  # at least one visible token, always
            seen[(1 + i % 3, usage["completion_tokens"], len(text), out["choices"][0]["finish_reason"])] += 1
        # max_tokens 1: one visible token, cut by length. 2: a token, then EOS as the last token allowed
        # (SGLang 0.5.22's update_finish_state checks stop tokens before the length cap: "stop"). 3: EOS as
        # token 2 or 3 ("stop" both).
        assert set(seen) == {(1, 1, 1, "length"), (2, 2, 1, "stop"), (3, 2, 1, "stop"), (3, 3, 2, "stop")}

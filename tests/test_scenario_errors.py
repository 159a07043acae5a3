"""`kvadmit capacity --scenario`: every invalid snapshot, alone or in a file of many, gets one line that
names it and exit status 2, never a traceback; the valid snapshots around it are still answered, one JSON
line per snapshot in order. The snapshot reader is fuzzed: whatever JSON it is given, it answers or says
what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvadmit.capacity.scenario import Item, answer_item
from kvadmit.capacity.snapshot import SnapshotError
from kvadmit.cli import main

VALID: dict[str, Any] = {
    "server": {"max_total_tokens": 4096, "page_size": 1, "chunked_prefill_size": 8192},
    "new_token_ratio": 0.7,
    "evictable_tokens": 0,
    "running": [{"rid": "a", "prompt_len": 256, "output_len": 40, "max_new_tokens": 512, "ignore_eos": True}],
    "waiting": [{"rid": "b", "prompt_len": 256, "cached_prefix_len": 0, "max_new_tokens": 512}],
}
ONE_TOKEN_POOL = {
    "server": {"max_total_tokens": 1},
    "waiting": [{"rid": "a", "prompt_len": 1, "max_new_tokens": 1}],
}


def test_a_one_token_pool_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(ONE_TOKEN_POOL))
    assert main(["capacity", "--scenario", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(
        f"kvadmit capacity: error: {path}: a pool of 1 tokens holds fewer than two pages"
    )


def test_in_a_file_of_many_each_invalid_snapshot_is_named_and_the_rest_answered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_check = {**VALID, "check": "x"}
    lines = [
        json.dumps(VALID),
        json.dumps(ONE_TOKEN_POOL),
        "{not json",
        "",
        json.dumps(bad_check),
        json.dumps(VALID),
    ]
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main(["capacity", "--scenario", str(path), "--json"]) == 2
    out, err = capsys.readouterr()
    answers = [json.loads(line) for line in out.splitlines()]
    assert len(answers) == 5  # one per snapshot (the blank line is none), in order
    assert answers[0]["admitted"] == ["b"] and answers[4]["admitted"] == ["b"]
    assert [sorted(a) for a in answers[1:4]] == [["error"]] * 3
    named = [line for line in err.splitlines() if line.startswith("kvadmit capacity: error: ")]
    assert [n.split(": ")[2] for n in named] == [f"{path}, line {i}" for i in (2, 3, 5)]
    assert err.splitlines()[-1] == "kvadmit capacity: 3 of 5 snapshots are invalid (answered the rest)"


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
PATHS = [
    ("server", "max_total_tokens"), ("server", "page_size"), ("server", "chunked_prefill_size"),
    ("server", "max_running_requests"), ("server", "max_prefill_tokens"), ("server", "context_length"),
    ("server", "schedule_conservativeness"), ("server", "sglang_version"), ("server", "env"),
    ("new_token_ratio",), ("evictable_tokens",), ("check",), ("running",), ("waiting",),
    ("running", 0, "prompt_len"), ("running", 0, "output_len"), ("running", 0, "max_new_tokens"),
    ("running", 0, "rid"), ("waiting", 0, "prompt_len"), ("waiting", 0, "cached_prefix_len"),
    ("waiting", 0, "max_new_tokens"), ("waiting", 0, "output_len"), ("waiting", 0, "ignore_eos"),
]  # fmt: skip


def _set(snapshot: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    snap = json.loads(json.dumps(snapshot))
    node = snap
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return snap


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PATHS), JSON_VALUES), min_size=1, max_size=3))
def test_a_snapshot_with_any_field_set_to_any_json_is_answered_or_named(changes: list[Any]) -> None:
    snap = VALID
    for path, value in changes:
        try:
            snap = _set(snap, path, value)
        except (KeyError, IndexError, TypeError):  # an earlier change removed the path
            continue
    try:
        assert isinstance(answer_item(Item("fuzz", snap)), dict)
    except SnapshotError as e:
        assert str(e).startswith("fuzz: ")


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES)
def test_any_json_value_is_answered_or_named(value: Any) -> None:
    try:
        answer_item(Item("fuzz", value))
    except SnapshotError as e:
        assert str(e).startswith("fuzz: ")

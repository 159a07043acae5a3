"""`kvadmit capacity --scenario FILE`: one snapshot (JSON) or many (JSONL), answered in order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TextIO

from kvadmit.capacity.answer import answer
from kvadmit.capacity.snapshot import SnapshotError, parse_snapshot
from kvadmit.config import ConfigError
from kvadmit.errors import UsageError


class ScenarioError(ValueError):
    """The scenario file cannot be read at all; the message names the file and the problem."""


@dataclass(frozen=True, slots=True)
class Item:
    """One snapshot of the file, where it is ("FILE, line 3"), and its decoded JSON, or why it has none."""

    where: str
    data: Any = None
    error: str | None = None


def load_items(path: str) -> tuple[list[Item], bool]:
    """(items, is_many). A file holding one JSON value is one snapshot (or a list of them); otherwise
    every non-empty line is one. A line that is not JSON is an item with its error, so the lines after
    it are still answered."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ScenarioError(f"cannot read scenario file {path!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"scenario file {path!r} is not UTF-8 text") from None
    if not text.strip():
        raise ScenarioError(f"scenario file {path!r} is empty")
    try:
        whole: Any = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        return [Item(f"{path}: item {i}", item) for i, item in enumerate(whole)], True
    if whole is not None:
        return [Item(path, whole)], False
    items = []
    # Lines end at "\n" only (a "\r" before it is JSON whitespace): str.splitlines would also split at
    # U+2028, U+0085 or \x1e, which a JSON string may hold raw, and cut that snapshot in two.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            items.append(Item(where, json.loads(line)))
        except json.JSONDecodeError as e:
            items.append(Item(where, error=f"not valid JSON ({e.msg}, column {e.colno})"))
    return items, True


def answer_item(item: Item) -> dict[str, Any]:
    """The answer to one snapshot; SnapshotError names the snapshot and what is wrong with it (a field, or a
    server the scheduler refuses, such as a pool of fewer than two pages)."""
    if item.error is not None:
        raise SnapshotError(f"{item.where}: {item.error}")
    try:
        return answer(parse_snapshot(item.data))
    except (SnapshotError, ConfigError) as e:
        raise SnapshotError(f"{item.where}: {e}") from None


def run_scenario_file(path: str, *, as_json: bool, out: TextIO, err: TextIO) -> int:
    """Answer every snapshot in order. An invalid one gets one line on `err` naming it, and, where answers
    are JSON lines, an {"error": ...} line in its place so that answer N stays snapshot N; the exit
    status is then 2 (after every valid snapshot was answered)."""
    try:
        items, many = load_items(path)
    except ScenarioError as e:
        raise UsageError(str(e)) from None
    if not many:
        try:
            ans = answer_item(items[0])
        except SnapshotError as e:
            raise UsageError(str(e)) from None
        out.write((json.dumps(ans) if as_json else _human(ans)) + "\n")
        return 0
    invalid = 0
    for item in items:
        try:
            out.write(json.dumps(answer_item(item)) + "\n")
        except SnapshotError as e:
            invalid += 1
            err.write(f"kvadmit capacity: error: {e}\n")
            out.write(json.dumps({"error": str(e)}) + "\n")
    if invalid and len(items) > 1:
        err.write(f"kvadmit capacity: {invalid} of {len(items)} snapshots are invalid (answered the rest)\n")
    return 2 if invalid else 0


def _human(ans: dict[str, Any]) -> str:
    lines: list[str] = []
    if "admitted" in ans:
        admitted = ", ".join(ans["admitted"]) or "none"
        lines.append(
            f"Admitted this pass: {admitted}" + (f" (chunked: {ans['chunked']})" if ans["chunked"] else "")
        )
        lines.append(
            f"Verdict: {ans['verdict']}"
            + (f" at {ans['stopped_at']}" if ans["stopped_at"] else "")
            + f"; rem_total_tokens {ans['rem_total_tokens']}, cur_rem_tokens {ans['cur_rem_tokens']}"
        )
    else:
        lines.append("Retracted: " + (", ".join(ans["retracted"]) or "none"))
        if ans["aborted"]:
            lines.append(f"Aborted: {ans['aborted']}: {ans['abort_message']}")
    lines.extend("  " + s for s in ans["explanation"])
    return "\n".join(lines)

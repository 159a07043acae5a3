"""`kvadmit capacity --scenario FILE`: one snapshot (JSON) or many (JSONL), answered in order."""

from __future__ import annotations

import json
from typing import Any, TextIO

from kvadmit.capacity.answer import answer
from kvadmit.capacity.snapshot import Snapshot, SnapshotError, parse_snapshot
from kvadmit.errors import UsageError


class ScenarioError(ValueError):
    """The scenario file cannot be read or parsed; the message names the file, line and problem."""


def load_snapshots(path: str) -> tuple[list[Snapshot], bool]:
    """(snapshots, is_many). A file holding one JSON value is one snapshot (or a list of them);
    otherwise every non-empty line must be one."""
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
    try:
        if isinstance(whole, list):
            return [_parse(item, f"{path}: item {i}") for i, item in enumerate(whole)], True
        if whole is not None:
            return [_parse(whole, path)], False
        snapshots = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise ScenarioError(
                    f"{path}, line {number}: not valid JSON ({e.msg}, column {e.colno})"
                ) from None
            snapshots.append(_parse(data, f"{path}, line {number}"))
        return snapshots, True
    except SnapshotError as e:
        raise ScenarioError(str(e)) from None


def _parse(data: Any, where: str) -> Snapshot:
    try:
        return parse_snapshot(data)
    except SnapshotError as e:
        raise SnapshotError(f"{where}: {e}") from None


def run_scenario_file(path: str, *, as_json: bool, out: TextIO) -> int:
    try:
        snapshots, many = load_snapshots(path)
        answers = [answer(s) for s in snapshots]
    except (ScenarioError, SnapshotError) as e:
        raise UsageError(str(e)) from None
    for i, ans in enumerate(answers):
        if as_json or many:
            out.write(json.dumps(ans) + "\n")
            continue
        if i:
            out.write("\n")
        out.write(_human(ans) + "\n")
    return 0


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

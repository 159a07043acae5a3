"""A held-back fleet's advice, simulated: the replicas' own advice (the cap raised, a realistic budget) is
what lifts the fleet's limit, so it is proved as the single-log doctor proves it (prove.py), on the log of
the replica that queued longest. The reconstruction reads one server's lines: from one log per replica,
that replica's file; from one log of DP ranks, that rank's lines written to a temporary file as its own
server would print them (its tag taken out, the untagged lines every rank reads kept), dealt as
fleet_read.py deals them."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from kvadmit.doctor.fleet import FleetDiagnosis, ReplicaVerdict
from kvadmit.doctor.fleet_read import dealt
from kvadmit.doctor.fleet_rules import FLEET_HELD_BACK
from kvadmit.doctor.source import LogSource


def _ms(x: float | None) -> str:
    return f"{x:,.0f} ms" if x is not None else "–"


def rank_log(path: str, tag: str, out: Path) -> None:
    """Write rank `tag`'s lines of the DP log `path` to `out` (fleet_read.dealt: its own, and those every
    rank reads), its tag taken out (`[… DP1 TP0]` → `[… TP0]`)."""
    src = LogSource(path)
    try:
        with out.open("w", encoding="utf-8") as f:
            for owner, tagged, _, text in dealt(src.lines()):
                if owner not in ("", tag):
                    continue
                if tagged:
                    head, sep, rest = text.partition("] ")
                    text = _untag(head + sep, tag) + rest
                f.write(text + "\n")
    finally:
        src.close()


def _untag(prefix: str, tag: str) -> str:
    """The line's prefix without the rank's tag, in either place SGLang prints it: `[… 00:00:00 DP1] ` (the
    timestamp's bracket: kvadmit, SGLang's default format) or `[DP1 TP1 EP1 file.py:222] ` (a logging
    format with the process's tags first)."""
    for old, new in ((f" {tag}]", "]"), (f" {tag} ", " "), (f"[{tag} ", "[")):
        if old in prefix:
            return prefix.replace(old, new, 1)
    return prefix


def prove_held_back(result: FleetDiagnosis, logs: list[str]) -> None:
    """Simulate the advice from the busiest replica's lines and add what it gives to the fleet's finding
    (its explanation, and `numbers["proof"]` in --json). Nothing for another verdict."""
    fleet = result.fleet
    if fleet.verdict != FLEET_HELD_BACK:
        return
    busiest = max(result.replicas, key=lambda r: r.peak_queue)
    if busiest.name in logs:
        _prove(result, busiest, busiest.name)
    elif len(logs) == 1 and busiest.name.startswith(("DP", "ATTN_DP")):
        with tempfile.TemporaryDirectory(prefix="kvadmit-rank-") as folder:
            own = Path(folder) / f"{busiest.name}.log"
            rank_log(logs[0], busiest.name, own)
            _prove(result, busiest, str(own))


def _prove(result: FleetDiagnosis, busiest: ReplicaVerdict, path: str) -> None:
    from kvadmit.doctor.prove import prove

    fleet = result.fleet
    proof = prove(path, busiest.diagnosis.verdict, [], busiest.diagnosis.lead.cause)
    if proof.reconstruction is None or len(proof.outcomes) < 2:
        fleet.explanation.append(f"The advice was not simulated: {proof.problem or 'nothing to simulate'}.")
        return
    today, best = proof.outcomes[0], proof.outcomes[1]  # (the advice, ranked: the best first)
    how = "its reconstruction reproduces its log" if proof.reproduced else (
        "its reconstruction does NOT reproduce its log: for reference only"
    )  # fmt: skip
    fleet.explanation.append(
        f"Simulated from {busiest.name} alone ({how}): {best.scenario.label}: TTFT p50 "
        f"{_ms(today.ttft_p50_ms)} → {_ms(best.ttft_p50_ms)}, verdict {best.verdict} (today "
        f"{today.verdict}); kvadmit doctor on its log alone shows the whole table."
    )
    numbers: dict[str, Any] = {
        "replica": busiest.name, "what_if": best.scenario.label, "reproduced": proof.reproduced,
        "today": today.row(), "advice": best.row(),
    }  # fmt: skip
    fleet.numbers["proof"] = numbers

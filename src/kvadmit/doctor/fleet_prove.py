"""A held-back fleet's advice, simulated: the replicas' own advice (the cap raised, a realistic budget) is
what lifts the fleet's limit, so it is proved as the single-log doctor proves it (prove.py), on the log of
the replica that queued longest. Only for one log per replica: a log of DP ranks interleaves them, and
the reconstruction reads one server's lines."""

from __future__ import annotations

from typing import Any

from kvadmit.doctor.fleet import FleetDiagnosis, ReplicaVerdict
from kvadmit.doctor.fleet_rules import FLEET_HELD_BACK


def _peak_queue(r: ReplicaVerdict) -> int:
    return r.numbers.peak_queue[0] if r.numbers.peak_queue else 0


def _ms(x: float | None) -> str:
    return f"{x:,.0f} ms" if x is not None else "–"


def prove_held_back(result: FleetDiagnosis, logs: list[str]) -> None:
    """Simulate the advice from the busiest replica's log and add what it gives to the fleet's finding
    (its explanation, and `numbers["proof"]` in --json). Nothing for another verdict or a log of ranks."""
    from kvadmit.doctor.prove import prove

    fleet = result.fleet
    names = [r.name for r in result.replicas]
    if fleet.verdict != FLEET_HELD_BACK or names != logs:
        return
    busiest = max(result.replicas, key=_peak_queue)
    lead = busiest.diagnosis.lead
    cause = lead.numbers.get("cause")
    proof = prove(busiest.name, busiest.diagnosis.verdict, [], cause if isinstance(cause, str) else None)
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
        f"{today.verdict}); kvadmit doctor {busiest.name} shows the whole table."
    )
    numbers: dict[str, Any] = {
        "replica": busiest.name, "what_if": best.scenario.label, "reproduced": proof.reproduced,
        "today": today.row(), "advice": best.row(),
    }  # fmt: skip
    fleet.numbers["proof"] = numbers

"""`kvadmit doctor` on a fleet: each replica's own verdict (the single-log doctor on that replica's lines),
the per-replica table, and the fleet's verdict (fleet_rules.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvadmit.doctor import findings as rules
from kvadmit.doctor.diagnose import insufficient_data
from kvadmit.doctor.fleet_read import ReplicaNumbers, ReplicaStream, read_fleet
from kvadmit.doctor.model import (
    COLLAPSE,
    IDLE_POOL,
    OCCASIONAL,
    OOM_ABORT,
    RANK_HEALTHY_NO_QUEUE,
    RANK_HEALTHY_WAITING,
    RANK_STALL,
    RANK_UNRELATED_FAILURE,
    STORM,
    Diagnosis,
    Finding,
    InputSummary,
    order,
)
from kvadmit.doctor.trackers import Quote

# A replica's state in the fleet, from its own verdict.
RETRACTING = "retracting"  # it retracted (or preempted) requests
QUEUEING = "queueing"  # requests waited there (a queue beside the running batch that lasted)
FAILING = "failing"  # out-of-memory aborts or failures unrelated to the pool
LIGHT = "light"  # no queue that lasted, no retraction
SILENT = "silent"  # no batch line at all: it admitted nothing
PRESSED = (RETRACTING, QUEUEING, FAILING)


@dataclass
class ReplicaVerdict:
    name: str
    diagnosis: Diagnosis
    numbers: ReplicaNumbers
    retractions: int  # retraction events
    retracted: int  # requests retracted
    state: str
    first_retraction: Quote | None = None
    dp_args: dict[str, str] = field(default_factory=dict)  # dp_size, load_balance_method (server_args)

    @property
    def requests(self) -> int:
        """Requests admitted: prefill admissions less the re-admissions of retracted requests."""
        return max(0, self.numbers.admissions - self.retracted)

    @property
    def peak_queue(self) -> int:
        """The largest #queue-req of its lines (0 without any)."""
        return self.numbers.peak_queue[0] if self.numbers.peak_queue else 0

    @property
    def requests_seen(self) -> bool:
        """Whether the log shows its admissions: Prefill lines, or no batch line at all (nothing admitted);
        a decode-only log (a PD decode worker, an excerpt) does not."""
        return self.numbers.prefill_lines > 0 or self.numbers.batch_lines == 0

    @property
    def prompt_per_request(self) -> float | None:
        n = self.numbers
        return (n.new_tokens + n.cached_tokens) / n.admissions if n.admissions else None

    @property
    def cached_share(self) -> float | None:
        """The share of prefilled prompt tokens the replica's prefix cache supplied."""
        n = self.numbers
        total = n.new_tokens + n.cached_tokens
        return n.cached_tokens / total if total else None

    def to_json(self) -> dict[str, Any]:
        d = self.diagnosis
        findings = [f.to_json() for f in d.findings]
        return {**self.row(), "summary": d.lead.title, "findings": findings, "server": d.server}

    def row(self) -> dict[str, Any]:
        n = self.numbers
        return {
            "replica": self.name,
            "verdict": self.diagnosis.verdict,
            "state": self.state,
            "requests": self.requests if self.requests_seen else None,
            "admissions": n.admissions,
            "peak_queue": self.peak_queue,
            "retractions": self.retractions,
            "retracted_requests": self.retracted,
            "usage_peak": n.peak_usage[0] if n.peak_usage else None,
            "usage_median": n.usage_median(),
            "gen_throughput_mean": round(n.throughput_mean, 2) if n.throughput_mean is not None else None,
            "cached_share": round(self.cached_share, 4) if self.cached_share is not None else None,
            "prompt_per_request": round(self.prompt_per_request, 1) if self.prompt_per_request else None,
            "peak_in_flight": n.peak_in_flight[0] if n.peak_in_flight else 0,
        }


@dataclass
class FleetDiagnosis:
    fleet: Finding
    replicas: list[ReplicaVerdict]
    inputs: list[InputSummary]

    @property
    def verdict(self) -> str:
        return self.fleet.verdict or "other"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.fleet.title,
            "fleet": self.fleet.to_json(),
            "replicas": [r.to_json() for r in self.replicas],
            "inputs": [i.to_json() for i in self.inputs],
        }


def replica_diagnosis(stream: ReplicaStream, summary: InputSummary) -> Diagnosis:
    """What `kvadmit doctor` says of a log holding only this replica's lines (log only, no metrics)."""
    c = stream.collected
    found = order(rules.log_findings(c))
    if not found or found[0].verdict is None:
        found.insert(0, insufficient_data(c, []))
    for f in found:
        for q in f.evidence:
            q.source = q.source or stream.source
    server: dict[str, object] = dict(c.startup)
    server["engine"] = sorted(c.engine)
    if c.ranks:
        server["ranks"] = sorted(c.ranks)[:16]
    return Diagnosis(found, [summary], c.timeline, server)


def state_of(d: Diagnosis, numbers: ReplicaNumbers, retractions: int) -> str:
    lead = d.lead
    if retractions or lead.verdict in (STORM, OCCASIONAL, COLLAPSE):
        return RETRACTING
    if lead.verdict == OOM_ABORT or lead.rank == RANK_UNRELATED_FAILURE:
        return FAILING
    if lead.verdict == IDLE_POOL or lead.rank in (RANK_STALL, RANK_HEALTHY_WAITING):
        return QUEUEING
    if lead.rank == RANK_HEALTHY_NO_QUEUE or numbers.admissions:
        return LIGHT
    return SILENT


def diagnose_fleet(paths: list[str]) -> FleetDiagnosis:
    from kvadmit.doctor.fleet_rules import fleet_finding

    replicas: list[ReplicaVerdict] = []
    inputs: list[InputSummary] = []
    for stream, summary in read_fleet(paths):
        d = replica_diagnosis(stream, summary)
        c = stream.collected
        events = c.retract.events + c.vllm.warnings
        retracted = c.retract.requests
        state = state_of(d, stream.collector.numbers, events)
        first = c.retract.first or (c.vllm.first[2] if c.vllm.first else None)
        _name_the_file(stream, first)
        replicas.append(
            ReplicaVerdict(
                stream.name, d, stream.collector.numbers, events, retracted, state, first, stream.dp_args
            )
        )
        inputs.append(summary)
    return FleetDiagnosis(fleet_finding(replicas), replicas, inputs)


def _name_the_file(stream: ReplicaStream, first: Quote | None) -> None:
    """The fleet verdict quotes each replica's peak lines: say which file each came from (its own verdict's
    evidence already does)."""
    n = stream.collector.numbers
    for peak in (n.peak_queue, n.peak_usage, n.peak_in_flight):
        if peak is not None:
            peak[1].source = peak[1].source or stream.source
    if first is not None:
        first.source = first.source or stream.source

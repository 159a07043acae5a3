"""What the doctor answers: findings (verdict, evidence, advice) and the diagnosis that orders them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvadmit.doctor.timeline import Timeline
from kvadmit.doctor.trackers import Quote

# The verdicts (the labels of the real log excerpts in tests/data/logs/README.md).
HEALTHY_QUEUE = "healthy-queue"
IDLE_POOL = "idle-pool-with-queue"
STORM = "retraction-storm"
OCCASIONAL = "retraction-occasional"
COLLAPSE = "throughput-collapse"
OOM_ABORT = "oom-abort"
OTHER = "other"

# An idle pool's cause when #running-req sits at the --max-running-requests cap (pool_rules.py; the advice
# and the what-if read it).
CAP_CAUSE = "max-running-requests"

# Which finding leads when several hold. Requests waiting is the question the doctor answers first, so
# a healthy queue with a rare retraction reads "healthy queue"; without a queue the retraction leads.
RANK_OOM = 0
RANK_COLLAPSE = 1
RANK_STORM = 2
RANK_IDLE = 3
RANK_STALL = 4  # admission stood still after a retraction for a good part of the log
RANK_UNRELATED_FAILURE = 5
RANK_HEALTHY_WAITING = 6
RANK_OCCASIONAL = 7
RANK_HEALTHY_NO_QUEUE = 8
RANK_INSUFFICIENT = 9
RANK_NOTE = 20  # supporting findings: no verdict of their own


@dataclass
class Finding:
    kind: str  # the verdict it supports, or a note's name ("admission-stall", "metrics-pitfall", …)
    verdict: str | None  # one of the verdicts above; None for a supporting note
    rank: int
    title: str
    explanation: list[str] = field(default_factory=list)
    evidence: list[Quote] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def cause(self) -> str | None:
        """The cause the finding names, where it names one (an idle pool's: pool_rules.py)."""
        cause = self.numbers.get("cause")
        return cause if isinstance(cause, str) else None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "verdict": self.verdict,
            "title": self.title,
            "explanation": self.explanation,
            "evidence": [q.to_json() for q in self.evidence],
            "advice": self.advice,
            "numbers": self.numbers,
        }


@dataclass
class InputSummary:
    """What was read: per input, lines recognised and not, and anything odd about the bytes."""

    source: str
    kind: str  # "log" | "metrics" | "watch"
    lines: int = 0
    recognised: int = 0
    unknown: int = 0
    unknown_examples: list[Quote] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    span_s: float | None = None
    by_kind: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kind": self.kind,
            "lines": self.lines,
            "recognised": self.recognised,
            "unknown": self.unknown,
            "unknown_examples": [q.to_json() for q in self.unknown_examples],
            "notes": self.notes,
            "span_s": self.span_s,
            "by_kind": self.by_kind,
        }


@dataclass
class Diagnosis:
    findings: list[Finding]
    inputs: list[InputSummary]
    timeline: Timeline
    server: dict[str, Any] = field(default_factory=dict)

    @property
    def lead(self) -> Finding:
        return self.findings[0]

    @property
    def verdict(self) -> str:
        return self.lead.verdict or OTHER

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.lead.title,
            "findings": [f.to_json() for f in self.findings],
            "inputs": [i.to_json() for i in self.inputs],
            "server": self.server,
            "timeline": self.timeline.to_json(),
        }


def order(findings: list[Finding]) -> list[Finding]:
    """Verdict findings by rank, each followed by nothing else; notes after them."""
    return sorted(findings, key=lambda f: f.rank)

"""The scheduling decisions an SGLang log records, so that two logs (a server's and a replay's) can be
compared line by line: each Prefill batch, Decode batch and retraction line without its time stamp and
throughput (what the clock says), keeping what the scheduler chose and the state it left.

    prefill  #new-seq, #new-token, #cached-token, token usage, #running-req, #queue-req, #pending-token
    decode   #running-req, #token, token usage, #queue-req
    retract  #retracted_reqs, #new_tokens_gained, #new_token_ratio old -> new
    abort    a last request aborted for lack of memory (its id left out: ids differ between runs)

With --decode-log-interval 1 every step prints one of the batch lines, so the comparison is step for step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvadmit.observe.loglines import (
    DECODE,
    LAST_REQUEST_ABORTED,
    PREFILL,
    PREFILL_CLASSIC,
    RETRACT,
    LineFormat,
)

_KEPT: tuple[tuple[str, LineFormat, tuple[str, ...]], ...] = (
    ("prefill", PREFILL, ("new_seq", "new_token", "cached_token", "token_usage", "running_req", "queue_req",
                          "pending_token")),
    ("prefill", PREFILL_CLASSIC, ("new_seq", "new_token", "cached_token", "token_usage", "running_req",
                                  "queue_req")),
    ("decode", DECODE, ("running_req", "num_used_tokens", "token_usage", "queue_req")),
    ("retract", RETRACT, ("num_retracted", "new_tokens_gained", "old_ratio", "new_ratio")),
    ("abort", LAST_REQUEST_ABORTED, ()),
)  # fmt: skip

Decision = tuple[str, tuple[object, ...]]


def decisions(lines: Iterable[str]) -> list[Decision]:
    """The decision lines of a log, in order: (kind, the kept fields)."""
    out: list[Decision] = []
    for line in lines:
        for kind, fmt, names in _KEPT:
            if fmt.head and fmt.head not in line:
                continue
            values = fmt.parse(line)
            if values is not None:
                out.append((kind, tuple(values[n] for n in names)))
                break
    return out


@dataclass(frozen=True, slots=True)
class Comparison:
    real: int  # decision lines in each log
    sim: int
    same_prefix: int  # lines identical before the first difference
    first_real: Decision | None = None  # the first pair that differs (None where a log ran out)
    first_sim: Decision | None = None

    @property
    def identical(self) -> bool:
        return self.real == self.sim == self.same_prefix

    def describe(self) -> str:
        if self.identical:
            return f"all {self.real} identical"
        return (f"{self.same_prefix} of {max(self.real, self.sim)} identical, then #{self.same_prefix + 1}: "
                f"{_show(self.first_real)} vs {_show(self.first_sim)}")  # fmt: skip


def _show(d: Decision | None) -> str:
    return "(none)" if d is None else f"{d[0]} {d[1]}"


def compare(real: list[Decision], sim: list[Decision]) -> Comparison:
    same = 0
    for a, b in zip(real, sim, strict=False):
        if a != b:
            break
        same += 1
    if same == len(real) == len(sim):
        return Comparison(len(real), len(sim), same)

    def at(xs: list[Decision]) -> Decision | None:
        return xs[same] if same < len(xs) else None

    return Comparison(len(real), len(sim), same, at(real), at(sim))

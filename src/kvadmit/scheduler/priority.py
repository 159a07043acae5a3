"""Priority scheduling as SGLang 0.5.22 does it (docs/sglang-rules.md §13): each request's priority, the
queue order, which queued request a full queue turns away, which running requests an arriving request
preempts, and the retraction order under --retraction-policy priority.

Direction: larger values are more urgent; --schedule-low-priority-values-first makes smaller ones more
urgent. `sign` is +1 in the second case and −1 in the first, so `priority × sign` sorts the most urgent
first in both. A request without a priority is the least urgent possible (after --default-priority-value,
if that is set).

The scheduler calls in here from a few places (intake, ordering, admission, retraction); the rules and the
counter that stands for SGLang's wait-queue entry time live on one `PriorityScheduling` object.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Callable
from dataclasses import dataclass

from kvadmit.config import ServerArgs
from kvadmit.request import Req

PRIORITY_DISABLED_MESSAGE = (
    "Using priority is disabled for this server. Please send a new request without a priority."
)
ABORTED_BY_PRIORITY_MESSAGE = "The request is aborted by a higher priority request."
PRIORITY_RANGE_MESSAGE = (
    "priority must be a signed 64-bit integer between -9223372036854775808 and 9223372036854775807"
)
PRIORITY_MIN, PRIORITY_MAX = -(1 << 63), (1 << 63) - 1


def priority_in_range(value: int) -> bool:
    """The tokenizer's check: a priority is a signed 64-bit integer."""
    return PRIORITY_MIN <= value <= PRIORITY_MAX


@dataclass(slots=True)
class PriorityScheduling:
    enabled: bool = False
    low_values_first: bool = False
    default_value: int | None = None
    abort_when_disabled: bool = False
    preemption: bool = False  # enabled and not --disable-priority-preemption
    preemption_threshold: int = 10
    retract_by_priority: bool = False
    _entries: int = 0  # queue entries so far: the next request's queue_entry
    _sorted_below: int = 0  # the queue was in fcfs order at the last sort, with every entry below this

    @classmethod
    def from_args(cls, args: ServerArgs) -> PriorityScheduling:
        on = args.enable_priority_scheduling
        return cls(
            enabled=on,
            low_values_first=args.schedule_low_priority_values_first,
            default_value=args.default_priority_value,
            abort_when_disabled=args.abort_on_priority_when_disabled,
            preemption=on and not args.disable_priority_preemption,
            preemption_threshold=args.priority_scheduling_preemption_threshold,
            retract_by_priority=args.retraction_policy == "priority",
        )

    @property
    def sign(self) -> int:
        return 1 if self.low_values_first else -1

    @property
    def least_urgent(self) -> int:
        """What a request without a priority gets: sys.maxsize, or its negative − 1."""
        return sys.maxsize if self.low_values_first else -sys.maxsize - 1

    # ----- a request arrives ------------------------------------------------------------------
    def resolve(self, req: Req) -> bool:
        """Give `req` its priority (the default value, else the least urgent) when scheduling by priority;
        False when it must be turned away: it has a priority, priorities are off, and
        --abort-on-priority-when-disabled is set. (Without that flag its priority is kept and ignored.)"""
        if self.enabled:
            if req.priority is None:
                req.priority = self.default_value if self.default_value is not None else self.least_urgent
            return True
        return not (req.priority is not None and self.abort_when_disabled)

    def stamp(self, req: Req) -> None:
        """`req` enters the waiting queue now (SGLang stamps the time at every entry, re-queues included)."""
        req.queue_entry = self._entries
        self._entries += 1

    def key(self, req: Req) -> int:
        """Smaller is more urgent."""
        assert req.priority is not None, "priorities are resolved when a request is added"
        return req.priority * self.sign

    # ----- the waiting queue ------------------------------------------------------------------
    def sort_fcfs(self, waiting: list[Req]) -> None:
        """Most urgent first, then the earliest queue entry. Every pass asks for it, over the whole queue;
        the keys are unique and fixed while a request waits, and the queue only loses requests between
        passes or gains new entries at its end. So the requests that entered since the last sort (a
        suffix) are put in place one by one, which gives exactly the full sort's order."""
        sign = self.sign  # (self.key written out)

        def key(r: Req) -> tuple[int, int]:
            return (r.priority * sign, r.queue_entry)  # type: ignore[operator]

        mark = self._sorted_below
        self._sorted_below = self._entries
        if waiting and waiting[0].queue_entry >= mark and len(waiting) > 1:
            waiting.sort(key=key)  # a new entry at the front (a policy that re-queues there): sort all
            return
        new = 0
        while new < len(waiting) and waiting[-1 - new].queue_entry >= mark:
            new += 1
        if new == 0:
            return
        arrived = sorted(waiting[-new:], key=key)
        del waiting[-new:]
        for req in arrived:
            bisect.insort(waiting, req, key=key)

    def sort_lof(self, waiting: list[Req]) -> None:
        """Most urgent first, then the longest max_new_tokens (a stable sort: ties keep queue order)."""
        sign = self.sign
        waiting.sort(key=lambda r: (r.priority * sign, -r.max_new_tokens))  # type: ignore[operator]

    def queue_full_victim(self, incoming: Req, waiting: list[Req]) -> int | None:
        """The queue is full and `incoming` wants in. The index of the queued request to abort in its place,
        or None to turn `incoming` away. The candidate is the least urgent queued request (the latest
        entry among equals); it goes only if `incoming` is strictly more urgent."""
        if not self.enabled or not waiting:
            return None
        at = max(range(len(waiting)), key=lambda i: (self.key(waiting[i]), waiting[i].queue_entry))
        return at if self.key(incoming) < self.key(waiting[at]) else None

    # ----- preemption ---------------------------------------------------------------------------
    def beats(self, candidate: Req, running: Req) -> bool:
        """Is `candidate` more urgent than `running` by more than the threshold?"""
        assert candidate.priority is not None and running.priority is not None
        return (candidate.priority - running.priority) * -self.sign > self.preemption_threshold

    def may_preempt(self, candidate: Req, running: list[Req], counts: dict[int, int] | None = None) -> bool:
        """Whether choose_preempted can pick anyone: the least urgent running request (the first it
        tries) must qualify. One pass over the batch, without SGLang's exact budget sum and sort, which
        at a full batch would otherwise run on every scheduling pass. `counts`: the running batch's members
        per priority, for a first check without the pass."""
        if counts:
            # Every member, ended ones included, is at most as urgent as the least urgent live one: if the
            # candidate does not beat that, it beats no live request (the common case at a full batch).
            least_any = max(counts) if self.low_values_first else min(counts)
            if not (candidate.priority - least_any) * -self.sign > self.preemption_threshold:  # type: ignore[operator]
                return False
        values = [r.priority for r in running if r.finished_reason is None]
        if not values:
            return False
        least = max(values) if self.low_values_first else min(values)  # type: ignore[type-var]
        assert candidate.priority is not None and least is not None
        return (candidate.priority - least) * -self.sign > self.preemption_threshold

    def choose_preempted(
        self, candidate: Req, running: list[Req], tokens_short: float, offset_of: Callable[[Req], float]
    ) -> list[Req] | None:
        """SGLang's preempt_to_schedule, the choice. Running requests from the least urgent (the latest
        queue entry among equals) are taken while `candidate` beats each by more than the threshold,
        until their reservations (`offset_of`) cover `tokens_short`; None if none qualifies or they do
        not cover it. Requests that ended but still sit in the batch are not candidates."""
        order = sorted((r for r in running if not r.finished), key=lambda r: (-self.key(r), -r.queue_entry))
        chosen: list[Req] = []
        for r in order:
            if not self.beats(candidate, r):
                break
            chosen.append(r)
            tokens_short -= offset_of(r)
            if tokens_short <= 0:
                break
        if not chosen or tokens_short > 0:
            return None
        return chosen

    # ----- retraction -------------------------------------------------------------------------
    def retraction_order(self, reqs: list[Req]) -> list[int]:
        """--retraction-policy priority: keep-preference order (victims from the end). The most urgent
        are kept first; within a priority, SGLang's length rule (most outputs, then shortest prompt)."""
        return sorted(
            range(len(reqs)),
            key=lambda i: (-self.key(reqs[i]), len(reqs[i].output_ids), -len(reqs[i].origin_input_ids)),
            reverse=True,
        )


def tokens_to_free(candidate: Req, rem_total_tokens: float | int, clip: int) -> float | int:
    """What preemption must free for `candidate`, as SGLang computes it before it prepares the candidate
    again: its prompt (+ outputs) as of its last prefill pass (0 if it never had one), minus the prefix
    matched then, plus its clipped max_new_tokens, minus the budget left now. Evaluated in SGLang's order
    (integers first, then the one float subtraction), so the result is bit-identical."""
    return (
        candidate.examined_fill_len
        - candidate.prefix_len
        + min(candidate.max_new_tokens, clip)
        - (rem_total_tokens)
    )

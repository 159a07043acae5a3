"""The running batch: requests that decode together, and the KV they are forecast to need.

SGLang keeps requests that finished in the last decode step in the running batch until the next decode
pass filters them out; meanwhile they still count in the running size and in the reservation admission
holds back (docs/sglang-rules.md §1.3, confirmed in the scheduler's code). This class does the same.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque

from kvadmit.memory.pool import TokenPool
from kvadmit.request import Req
from kvadmit.scheduler.owed_slots import LIMIT, OwedSlots

# Relative error of one floating-point operation, doubled for safety (2^-52 rather than 2^-53).
_ULP = 2.0**-52


class RunningBatch:
    """Requests in decode order, with the running sums that make the admission budget O(1).

    The reservation of a running request is min(max_new_tokens − outputs, clip) × r, where r is 1.0 for
    ignore_eos requests under 0.5.22 and the new-token ratio otherwise. We keep the integer sums of the
    clipped remainders for the two kinds; `fast_reservation` turns them into the float total in O(1).
    A decode step gives every request one token, so each sum shrinks by the number of its requests at or
    below the clip: all of them but the few (max_new_tokens > clip) still above it, listed in `_above`.
    For the same reason the decode step at which a request reaches max_new_tokens is known when it
    joins: a heap of those steps tells `reached_length` who is due without scanning the batch.
    """

    __slots__ = (
        "_above",
        "_due",
        "_n_full",
        "_pushed",
        "_steps",
        "_sum_full",
        "_sum_ratio",
        "batch_is_full",
        "clip",
        "full_for_ignore_eos",
        "kv_tokens",
        "kvs",
        "member_ids",
        "outs",
        "owed",
        "priority_counts",
        "reqs",
    )

    def __init__(
        self, clip: int, full_for_ignore_eos: bool, reqs: list[Req] | None = None, defer_slots: bool = False
    ) -> None:
        """`defer_slots` (page size 1 only): keep decode steps' slots owed until read (owed_slots.py)."""
        self.clip = clip
        self.full_for_ignore_eos = full_for_ignore_eos
        self.batch_is_full = False
        self.reqs: list[Req] = []
        # Parallel to reqs, for the decode step's C-speed appends: each request's output and KV lists.
        self.outs: list[list[int]] = []
        self.kvs: list[array[int]] = []
        # id() of each member, kept as requests join and leave: "is it in the batch?" in O(1), where a set
        # built from the 512 members was about 25 µs a prefill result.
        self.member_ids: set[int] = set()
        # Σ len(kv) over the batch: the KV a decode step's attention reads (the cost model's K), kept
        # as requests join and leave and as each decode step gives each of them a slot.
        self.kv_tokens = 0
        self._sum_full = 0
        self._sum_ratio = 0
        self._n_full = 0  # requests reserving in full (ignore_eos under 0.5.22)
        self._above: list[Req] = []  # requests whose remainder is still above the clip
        self._steps = 0  # decode steps taken (after_decode_step calls)
        # (the decode step at which max_new_tokens − outputs reaches 0, push count, request); entries of
        # requests that have left the batch stay until their step comes and are skipped then.
        self._due: list[tuple[int, int, Req]] = []
        self._pushed = 0
        # How many members hold each priority (priority scheduling): the least urgent member in O(#values).
        self.priority_counts: dict[int, int] = {}
        self.owed: OwedSlots | None = OwedSlots() if defer_slots else None
        if reqs:
            self.extend(reqs)

    def __len__(self) -> int:
        return len(self.reqs)

    def _term(self, req: Req) -> int:
        # req.remaining_new_tokens written out: exact_reservation calls this per running request.
        return min(req.max_new_tokens - len(req.output_ids), self.clip)

    def _in_full(self, req: Req) -> bool:
        return self.full_for_ignore_eos and req.sampling.ignore_eos

    def _count(self, req: Req, sign: int) -> None:
        if self._in_full(req):
            self._sum_full += sign * self._term(req)
            self._n_full += sign
        else:
            self._sum_ratio += sign * self._term(req)

    def extend(self, reqs: list[Req]) -> None:
        counts = self.priority_counts
        for req in reqs:
            if req.priority is not None:
                counts[req.priority] = counts.get(req.priority, 0) + 1
            self.reqs.append(req)
            self.member_ids.add(id(req))
            self.outs.append(req.output_ids)
            self.kvs.append(req.kv)
            self.kv_tokens += len(req.kv)
            self._count(req, +1)
            left = req.remaining_new_tokens
            self._push_due(req, left)
            if left > self.clip:
                self._above.append(req)

    def _push_due(self, req: Req, left: int) -> None:
        heapq.heappush(self._due, (self._steps + left, self._pushed, req))
        self._pushed += 1

    def replace(self, reqs: list[Req]) -> None:
        """Keep exactly `reqs`, in this order (after filtering or retraction)."""
        self.settle_all()
        self.reqs, self.outs, self.kvs = [], [], []
        self.member_ids = set()
        self.kv_tokens = 0
        self._sum_full = self._sum_ratio = self._n_full = 0
        self._above = []
        self._due = []
        self.priority_counts = {}
        self.extend(reqs)

    def drop_at(self, positions: list[int]) -> None:
        """Remove the requests at these positions (ascending), taking their terms out of the sums."""
        gone: set[int] = set()
        owed = self.owed if self.owed is not None and self.owed.steps else None
        for i in reversed(positions):
            req = self.reqs[i]
            if owed is not None:  # its owed slots: written now, unless it was given them when it ended
                if id(req) in owed.done:
                    owed.done.discard(id(req))
                else:
                    owed.give(self.kvs[i], i)
                owed.forget(i)
            self._count(req, -1)
            # kvs[i] is the array it decoded into (a request that ended has a new, empty req.kv)
            self.kv_tokens -= len(self.kvs[i])
            del self.reqs[i], self.outs[i], self.kvs[i]
            gone.add(id(req))
            self.member_ids.discard(id(req))
            if req.priority is not None:
                left = self.priority_counts[req.priority] - 1
                if left:
                    self.priority_counts[req.priority] = left
                else:
                    del self.priority_counts[req.priority]
        if self._above:
            self._above = [r for r in self._above if id(r) not in gone]

    def take_decode_slots(self, pool: TokenPool) -> None:
        """A decode step's slot for each member, from `pool` (page size 1): appended to each member's KV
        array now or, where the batch defers its slots (its pool is then anonymous: defer_decode_slots),
        counted and owed (owed_slots.py) until something reads the arrays, all of them at LIMIT steps."""
        n = len(self.reqs)
        owed = self.owed
        if owed is None:
            deque(map(array.append, self.kvs, pool.alloc_decode(n)), maxlen=0)
        else:
            pool.take_count(n)
            owed.steps.append(n)
            if len(owed.steps) >= LIMIT:
                self.settle_all()
        self.kv_tokens += n  # one slot each

    def settle(self, req: Req, position: int = -1) -> None:
        """Write the decode slots `req` is owed into its KV array (it ends: the cache takes the array).
        `position`: where it is in the batch, if the caller knows (−1: found here)."""
        owed = self.owed
        key = id(req)
        if owed is None or not owed.steps or key not in self.member_ids or key in owed.done:
            return
        i = position if position >= 0 else self.reqs.index(req)
        assert self.reqs[i] is req, "settle: the position given is not the request's"
        owed.give(self.kvs[i], i)
        owed.done.add(key)

    def settle_all(self) -> None:
        """Write every member's owed decode slots into its KV array (before anything reads the arrays)."""
        owed = self.owed
        if owed is not None and owed.steps:
            owed.give_all(self.kvs, list(map(id, self.reqs)) if owed.done else [])

    def append_output(self, req: Req, token: int) -> None:
        """A member got an output token outside a decode step (under the overlap loop, the first token
        of a prefill whose requests were merged before its result came): move its term and due step."""
        self._count(req, -1)
        req.output_ids.append(token)
        self._count(req, +1)
        left = req.remaining_new_tokens
        self._push_due(req, left)
        if left <= self.clip and any(r is req for r in self._above):
            self._above = [r for r in self._above if r is not req]

    def due_within(self, limit: int) -> list[Req]:
        """Live members with at most `limit` outputs left (max_new_tokens − outputs ≤ limit), found by
        walking only the heap entries due within `limit` steps."""
        bound = self._steps + limit
        due = self._due
        found: dict[int, Req] = {}
        stack = [0] if due else []
        while stack:
            i = stack.pop()
            if i >= len(due) or due[i][0] > bound:
                continue  # a heap: no entry below this one is due sooner
            req = due[i][2]
            if req.finished_reason is None and req.max_new_tokens - len(req.output_ids) <= limit:
                found[id(req)] = req
            stack += (2 * i + 1, 2 * i + 2)
        if not found:
            return []
        members = self.member_ids  # entries of requests that left the batch stay in the heap
        return [r for k, r in found.items() if k in members]

    def after_decode_step(self, not_stepped: list[Req] | None = None) -> None:
        """Every request has just got one token: each remainder at or below the clip shrank by one.
        `not_stepped`: members that got none (under the overlap loop, requests that ended while the step
        was in flight and still wait to be dropped); their terms are put back."""
        above_full = above_ratio = 0
        still_above = []
        for req in self._above:
            if self._in_full(req):
                above_full += 1
            else:
                above_ratio += 1
            # req.remaining_new_tokens written out: this runs every decode step over the requests above
            # the clip, and the property call took this loop from 157 to 184 µs at 1,024 of them.
            if req.max_new_tokens - len(req.output_ids) > self.clip:
                still_above.append(req)
        self._above = still_above
        self._sum_full -= self._n_full - above_full
        self._sum_ratio -= len(self.reqs) - self._n_full - above_ratio
        self._steps += 1
        for req in not_stepped or ():
            if req.max_new_tokens - len(req.output_ids) <= self.clip:  # it was charged one, wrongly
                if self._in_full(req):
                    self._sum_full += 1
                else:
                    self._sum_ratio += 1

    def reached_length(self) -> list[int]:
        """Indices (ascending) of the live requests that have as many outputs as max_new_tokens allows:
        those whose due step has come (usually none)."""
        due = self._due
        if not due or due[0][0] > self._steps:
            return []  # the usual step, without the sort below (a call of the builtin: most of its cost)
        found: list[int] = []
        while due and due[0][0] <= self._steps:
            req = heapq.heappop(due)[2]
            if req.finished_reason is not None:
                continue  # it ended (and left the batch, or leaves it at the next pass)
            try:
                i = self.reqs.index(req)
            except ValueError:
                continue  # it left the batch unfinished (retracted; or, under the overlap loop, dropped
                # as finishing in the step in flight); rejoining gives it a new entry
            left = req.remaining_new_tokens
            # Due again next step (left ≤ 0) if it is still running then; never earlier than its remainder.
            self._push_due(req, max(left, 1))
            if left <= 0:
                found.append(i)
        return sorted(found)

    def fast_reservation(self, ratio: float) -> tuple[float, float]:
        """(Σ reservations, a bound on its distance from SGLang's batch-order float sum)."""
        value = self._sum_full + ratio * self._sum_ratio
        magnitude = abs(self._sum_full) + abs(self._sum_ratio) + 1.0
        return value, (len(self.reqs) + 4) * _ULP * magnitude

    def exact_reservation(self, ratio: float) -> float | int:
        """SGLang's own sum: each request's product added in batch order, starting from int 0."""
        total: float | int = 0
        for req in self.reqs:
            r = 1.0 if self._in_full(req) else ratio
            total += self._term(req) * r
        return total

"""Decode slots handed out but not yet written into the requests' KV arrays (page size 1, simulation).

A decode step gives each of the B running requests one pool slot; appending them one by one to B
separate arrays was about a tenth of an ordinary simulated step (docs/sim-speed-profile.md). Nothing in a
simulation reads a slot id, only how many slots a request, the cache and the pool hold, so its pool is
anonymous (every slot it hands out is 0, memory/pool.py) and a decode step here records only how many
members it gave a slot. The requests' arrays grow by what they are owed when something reads them: the
request ends or leaves the batch, a retraction or preemption releases KV, a mixed chunk or a leap takes
the batch's arrays, or `LIMIT` steps have piled up. Every array then has the length appending at once
gives it.

The steps stay aligned with the batch: step s gave a slot to the members at positions 0 … steps[s] − 1.
A request that leaves is taken out of every step (positions after it shift down, as in the batch); a
request that joins goes to the end, past every step taken before it joined, so it owes nothing for them.
Hence the counts never decrease from one step to the next, and the request at position p is owed
exactly the steps whose count exceeds p: the latest ones.
"""

from __future__ import annotations

from array import array
from collections import deque
from itertools import repeat

from kvadmit.memory.pool import blank_slots

LIMIT = 32  # steps kept before all are written out


class OwedSlots:
    """How many members each decode step not yet written into the batch's KV arrays gave a slot."""

    __slots__ = ("done", "steps")

    def __init__(self) -> None:
        # per step, how many members it gave a slot (positions 0 … n − 1); never fewer than the step before
        self.steps: list[int] = []
        # ids of members already given their slots (they ended: their arrays went to the prefix cache).
        # No step gives them another slot: an ended request leaves the batch before the next decode step.
        self.done: set[int] = set()

    def first_step(self, position: int) -> int:
        """Index of the first step the request at `position` is owed a slot by (len(steps): none)."""
        steps = self.steps
        lo, hi = 0, len(steps)
        while lo < hi:  # counts are non-decreasing: binary search for the first above position
            mid = (lo + hi) // 2
            if steps[mid] > position:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def give(self, kv: array[int], position: int) -> None:
        """Write the slots the request at `position` is owed into its array `kv`."""
        owed = len(self.steps) - self.first_step(position)
        if owed:
            kv.extend(blank_slots(owed))

    def forget(self, position: int) -> None:
        """The request at `position` leaves the batch: take it out of every step that gave it a slot."""
        steps = self.steps
        for s in range(self.first_step(position), len(steps)):
            steps[s] -= 1

    def give_all(self, kvs: list[array[int]], ids: list[int]) -> None:
        """Write every member's owed slots (`kvs` and their owners' `ids` by batch position; the ids
        are read only when some member was given its slots already) and start afresh. Members owed the
        same steps form a block of positions, and get one shared array of that many slots."""
        steps, done = self.steps, self.done
        lo = 0
        for first in range(len(steps)):
            hi = steps[first]
            if hi <= lo:
                continue
            members = kvs[lo:hi]
            if done:
                members = [kv for kv, key in zip(members, ids[lo:hi], strict=True) if key not in done]
            deque(map(array.extend, members, repeat(blank_slots(len(steps) - first))), maxlen=0)
            lo = hi
        self.steps = []
        self.done = set()

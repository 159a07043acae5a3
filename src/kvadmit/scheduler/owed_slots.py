"""Decode slots handed out but not yet written into the requests' KV arrays (page size 1).

A decode step gives each of the B running requests one pool slot; appending them one by one to 512
separate arrays was about a tenth of an ordinary simulated step (docs/sim-speed-profile.md). Instead the
running batch keeps each step's slot array as the pool handed it out and writes the slots into the
requests' arrays later, a request at a time (one strided slice, one extend), when something reads them:
the request ends or leaves the batch, a retraction or preemption releases KV, a mixed chunk or a leap takes
the batch's arrays, or `LIMIT` steps have piled up. Slot ids and their order in each array are the same
as appending at once.

The steps stay aligned with the batch: `steps[s][p]` is the slot step s gave the request now at position
p. A request that leaves has its entry deleted from every step (positions after it shift down, as in the
batch); a request that joins goes to the end, past every step taken before it joined, so it owes nothing
for them. Hence the steps' lengths never decrease from one step to the next, and the request at position
p is owed exactly the steps whose length exceeds p: the latest ones.
"""

from __future__ import annotations

from array import array
from collections import deque

LIMIT = 32  # steps kept before all are written out (a request's share is then one slice of 32)


class OwedSlots:
    """The slot arrays of the decode steps not yet written into the batch's KV arrays."""

    __slots__ = ("done", "steps")

    def __init__(self) -> None:
        self.steps: list[array[int]] = []  # per step, the slots by batch position (lengths non-decreasing)
        # ids of members already given their slots (they ended: their arrays went to the prefix cache).
        # No step gives them another slot: an ended request leaves the batch before the next decode step.
        self.done: set[int] = set()

    def first_step(self, position: int) -> int:
        """Index of the first step the request at `position` is owed a slot by (len(steps): none)."""
        steps = self.steps
        lo, hi = 0, len(steps)
        while lo < hi:  # lengths are non-decreasing: binary search for the first longer than position
            mid = (lo + hi) // 2
            if len(steps[mid]) > position:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def give(self, kv: array[int], position: int) -> None:
        """Write the slots the request at `position` is owed into its array `kv`."""
        kv.extend(array(kv.typecode, [s[position] for s in self.steps[self.first_step(position) :]]))

    def forget(self, position: int) -> None:
        """The request at `position` leaves the batch: take its entries out of every step."""
        for s in self.steps[self.first_step(position) :]:
            del s[position]

    def give_all(self, kvs: list[array[int]], ids: list[int]) -> None:
        """Write every member's owed slots (`kvs` and their owners' `ids` by batch position; the ids
        are read only when some member was given its slots already) and start afresh.
        Members owed the same steps form a block of positions: its steps' slices laid end to end hold
        member j's slots at j, j + width, j + 2·width, … (one strided slice each)."""
        steps, done = self.steps, self.done
        lo = 0
        for first in range(len(steps)):
            hi = len(steps[first])
            if hi <= lo:
                continue
            width = hi - lo
            flat = steps[first][lo:hi]
            for s in steps[first + 1 :]:
                flat.extend(s[lo:hi])
            shares = [flat[j::width] for j in range(width)]
            if done:
                for j in range(width):
                    if ids[lo + j] in done:
                        shares[j] = flat[:0]
            deque(map(array.extend, kvs[lo:hi], shares), maxlen=0)
            lo = hi
        self.steps = []
        self.done = set()

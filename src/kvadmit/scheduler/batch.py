"""The running batch: requests that decode together, and the KV they are forecast to need.

SGLang keeps requests that finished in the last decode step in the running batch until the next decode
pass filters them out; meanwhile they still count in the running size and in the reservation admission
holds back (reference §1.3, confirmed in the scheduler's code). This class does the same.
"""

from __future__ import annotations

from kvadmit.request import Req

# Relative error of one floating-point operation, doubled for safety (2^-52 rather than 2^-53).
_ULP = 2.0**-52


class RunningBatch:
    """Requests in decode order, with the running sums that make the admission budget O(1).

    The reservation of a running request is min(max_new_tokens − outputs, clip) × r, where r is 1.0 for
    ignore_eos requests under 0.5.22 and the new-token ratio otherwise. We keep the integer sums of the
    clipped remainders for the two kinds; `fast_reservation` turns them into the float total in O(1).
    """

    __slots__ = ("_sum_full", "_sum_ratio", "batch_is_full", "clip", "full_for_ignore_eos", "reqs")

    def __init__(self, clip: int, full_for_ignore_eos: bool, reqs: list[Req] | None = None) -> None:
        self.clip = clip
        self.full_for_ignore_eos = full_for_ignore_eos
        self.batch_is_full = False
        self.reqs: list[Req] = []
        self._sum_full = 0
        self._sum_ratio = 0
        if reqs:
            self.extend(reqs)

    def __len__(self) -> int:
        return len(self.reqs)

    def _term(self, req: Req) -> int:
        return min(req.sampling.max_new_tokens - len(req.output_ids), self.clip)

    def _in_full(self, req: Req) -> bool:
        return self.full_for_ignore_eos and req.sampling.ignore_eos

    def extend(self, reqs: list[Req]) -> None:
        for req in reqs:
            self.reqs.append(req)
            if self._in_full(req):
                self._sum_full += self._term(req)
            else:
                self._sum_ratio += self._term(req)

    def replace(self, reqs: list[Req]) -> None:
        """Keep exactly `reqs`, in this order (after filtering or retraction)."""
        self.reqs = []
        self._sum_full = 0
        self._sum_ratio = 0
        self.extend(reqs)

    def drop_finished(self) -> None:
        """Filter out ended requests, taking their terms out of the sums (Python work per ended one)."""
        for req in [r for r in self.reqs if r.finished_reason is not None]:
            if self._in_full(req):
                self._sum_full -= self._term(req)
            else:
                self._sum_ratio -= self._term(req)
        self.reqs = [r for r in self.reqs if r.finished_reason is None]

    def before_new_token(self, req: Req) -> None:
        """Call before appending an output token to a running request: its clipped remainder shrinks
        by one unless it is still above the clip."""
        if req.sampling.max_new_tokens - len(req.output_ids) <= self.clip:
            if self._in_full(req):
                self._sum_full -= 1
            else:
                self._sum_ratio -= 1

    def remainders_shrank(self, full: int, ratio: int) -> None:
        """The decode step's batched form of before_new_token: `full` requests reserving in full and
        `ratio` others were at or below the clip when they got a token."""
        self._sum_full -= full
        self._sum_ratio -= ratio

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

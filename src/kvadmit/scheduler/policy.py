"""Admission policies as one setting (`--admission-policy`), for comparing SGLang's forecast with the two
obvious alternatives the mission document rejects, on the same scheduler and the same trace.

* `sglang` (default): SGLang 0.5.22 exactly. A new request must fit its uncached prompt plus its clipped
  max_new_tokens; each running request holds back its remaining max_new_tokens × the new-token ratio,
  which decays from 0.7 to 0.098 and jumps back up after a retraction.
* `reserve-all`: every request reserves its full max_new_tokens, unclipped, for as long as it runs (the
  ratio is pinned at 1.0). Nothing is ever retracted, and the pool holds mostly reservations.
* `optimistic` (what vLLM V1 does): no output reservation at all. A request is admitted when its prompt
  fits; when a decode step finds no slot for every running request, the most recently admitted request
  is preempted (its KV freed, recomputed later) and goes back to the head of the queue.

Each policy is expressed through the scheduler's own knobs, so its decisions go through the same code:
reserve-all sets the ratio's start and floor to 1 and lifts the 4,096 clip; optimistic sets the clip to 0
(a reservation of min(remaining, 0) = 0 tokens) and the 20-token per-request headroom that retraction
frees to 0, and changes only the victim order and where a victim is re-queued.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvadmit.config import ADMISSION_POLICIES, SchedulerKnobs
from kvadmit.request import Req
from kvadmit.scheduler.priority import PriorityScheduling
from kvadmit.scheduler.retraction import retraction_order

NO_CLIP = 1 << 30  # larger than any max_new_tokens the scheduler accepts


def _newest_last(reqs: list[Req]) -> list[int]:
    """Keep-preference order = batch order, which is admission order under this policy (a merged prefill
    joins the end, a retraction keeps the order); victims are taken from the end: the newest first."""
    return list(range(len(reqs)))


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    name: str
    retraction_order: Callable[[list[Req]], list[int]] = retraction_order
    requeue_at_front: bool = False  # a retracted request goes to the head of the queue, not the tail
    # SGLang's future-occupancy check for ignore_eos requests without a prefix cache (docs/sglang-rules.md
    # §1.6)
    ignore_eos_occupancy_check: bool = True

    def knobs(self, knobs: SchedulerKnobs) -> SchedulerKnobs:
        if self.name == "reserve-all":
            # init = min(1e9 × conservativeness, 1) = 1 for any conservativeness > 0; floor = init; no decay.
            return replace(knobs, init_new_token_ratio=1e9, min_new_token_ratio_factor=1.0,
                           clip_max_new_tokens_estimation=NO_CLIP)  # fmt: skip
        if self.name == "optimistic":
            return replace(knobs, clip_max_new_tokens_estimation=0, retract_decode_steps=0)
        return knobs


POLICIES = {
    "sglang": AdmissionPolicy("sglang"),
    "reserve-all": AdmissionPolicy("reserve-all", ignore_eos_occupancy_check=False),
    "optimistic": AdmissionPolicy(
        "optimistic", retraction_order=_newest_last, requeue_at_front=True, ignore_eos_occupancy_check=False
    ),
}
assert tuple(POLICIES) == ADMISSION_POLICIES


def admission_policy(name: str, prio: PriorityScheduling | None = None) -> AdmissionPolicy:
    """The policy by name; with --retraction-policy priority, its victims are chosen by priority."""
    policy = POLICIES[name]
    if prio is not None and prio.retract_by_priority:
        policy = replace(policy, retraction_order=prio.retraction_order)
    return policy

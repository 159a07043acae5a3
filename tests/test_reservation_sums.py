"""The running batch's incremental reservation sums against the reservation recomputed from scratch.

Admission reads the running requests' reservation in O(1) from sums the batch keeps as requests join,
leave, decode and are retracted (scheduler/batch.py). Here random workloads (fixed seeds) run through
the real scheduler, and after every scheduler call the reservation is recomputed from its rule, request
by request: min(max_new_tokens − outputs, clip) × r, r = 1.0 for ignore_eos requests where the release
reserves them in full, else the new-token ratio. The pools are small (retraction), the clip low (requests
cross it while they decode), and some requests are aborted by the client.
"""

from __future__ import annotations

import random

from kvadmit.config import SchedulerKnobs, ServerArgs, version_profile
from kvadmit.request import Req, SamplingLimits
from kvadmit.scheduler.events import Retraction
from kvadmit.scheduler.scheduler import Scheduler

EOS = 0
CLIP = 48


def rule_reservation(reqs: list[Req], ratio: float, in_full: bool) -> float:
    """The running requests' reservation, from its rule, summed in batch order from int 0 (as SGLang)."""
    total: float = 0
    for req in reqs:
        left = min(req.max_new_tokens - len(req.output_ids), CLIP)
        total += left * (1.0 if in_full and req.sampling.ignore_eos else ratio)
    return total


def check_sums(sched: Scheduler, in_full: bool) -> None:
    running = sched.running
    reqs = running.reqs
    # Ratios 1 and 0 make the fast total exact (integer sums): the sum of everything, then of the
    # requests reserving in full alone. At the scheduler's own ratio it stays within its stated bound.
    assert running.fast_reservation(1.0)[0] == rule_reservation(reqs, 1.0, in_full)
    assert running.fast_reservation(0.0)[0] == rule_reservation(reqs, 0.0, in_full)
    ratio = sched.ratio.current
    value, bound = running.fast_reservation(ratio)
    assert abs(value - rule_reservation(reqs, ratio, in_full)) <= bound
    assert running.exact_reservation(ratio) == rule_reservation(reqs, ratio, in_full)


def run_workload(rng: random.Random, seen: dict[str, int]) -> None:
    version = rng.choice(("0.5.22", "0.5.10"))
    in_full = version_profile(version).ignore_eos_reserves_in_full
    args = ServerArgs(
        max_total_tokens=rng.choice((256, 384, 512, 1024)),
        page_size=rng.choice((1, 1, 4)),
        max_running_requests=rng.choice((4, 8, 32)),
        chunked_prefill_size=rng.choice((-1, 64, 128)),
        context_length=4096,
        sglang_version=version,
        knobs=SchedulerKnobs(clip_max_new_tokens_estimation=CLIP),
    )
    sched = Scheduler(args, eos_token_ids=frozenset({EOS}))
    eos_at: dict[str, int | None] = {}
    live: list[str] = []
    for step in range(250):
        if rng.random() < 0.35:
            rid = f"r{step}"
            max_new = rng.randint(1, 120)  # above and below the clip
            ignore_eos = rng.random() < 0.4
            eos_at[rid] = rng.randint(1, max_new) if rng.random() < 0.5 else None
            req = Req(rid, [rng.randint(1, 99) for _ in range(rng.randint(1, 96))],
                      SamplingLimits(requested_max_new_tokens=max_new, ignore_eos=ignore_eos))  # fmt: skip
            seen["above_clip"] += max_new > CLIP
            if sched.add_request(req):
                live.append(rid)
            check_sums(sched, in_full)
        if live and rng.random() < 0.03:
            sched.abort_request(rng.choice(live))
            check_sums(sched, in_full)
        batch = sched.next_batch()
        check_sums(sched, in_full)
        if batch is None:
            continue
        seen[batch.kind] += 1
        tokens = [EOS if eos_at.get(r.rid) == len(r.output_ids) + 1 else 7 for r in batch.reqs]
        sched.on_batch_done(batch, tokens)
        check_sums(sched, in_full)
        seen["retraction"] += sum(isinstance(e, Retraction) and bool(e.rids) for e in sched.drain_events())


def test_incremental_reservation_matches_the_sum_from_scratch() -> None:
    rng = random.Random(20261201)
    seen = dict.fromkeys(("prefill", "decode", "retraction", "above_clip"), 0)
    for _ in range(40):
        run_workload(rng, seen)
    # The runs went where the sums can go wrong: long decodes, retraction, requests above the clip.
    assert seen["decode"] > 1000 and seen["prefill"] > 100, seen
    assert seen["retraction"] > 0 and seen["above_clip"] > 100, seen

"""What an idle pool with a queue says about the requests' reservations (docs/sglang-rules.md §1–§2).

The pool is far from full while requests wait, and no retraction and no request cap explains it: the
waiting requests do not fit what the running ones reserve. Two workloads do that:

* ignore_eos (bench_serving's default): SGLang 0.5.22 reserves such a request's whole max_new_tokens
  (ratio 1) and it generates all of it. The running requests then reserve, together, their prompts and
  their whole outputs: B × (prompt + E[X] (1 + CV²)) fills the pool (the running ones are likely long,
  lengths.py), up to the head of the queue's own need.
* requests that ask for far more than they use, at the ratio: the running ones reserve ratio × (budget −
  output so far) each, which leaves B × (prompt + E[X] (1 + CV²)) well short of the pool. At the ratio's
  floor (0.098 × c, reached 600 decode steps after the start or a retraction: the last third of the
  waiting lines) the free room per running request f gives the budget: f ÷ floor + the mean output held.
"""

from __future__ import annotations

import statistics

from kvadmit.doctor.inferred import Inferred
from kvadmit.doctor.observed import Observed
from kvadmit.doctor.reconstruct import Reconstruction
from kvadmit.doctor.reconstruct_server import RATIO_FLOOR_AT_1

FILLED = 0.9  # ignore_eos: what the running requests reserve in all fills at least this share of the pool


def judge_reservation(rec: Reconstruction, obs: Observed, idle_pool: bool) -> None:
    """Sets reserves_all (and the budget) on an idle pool that no retraction and no request cap explain."""
    if not idle_pool or obs.retracts or rec.max_running_requests.confidence == "estimate":
        return
    waiting = [d for d in obs.decodes if d.queue and d.running and d.tokens is not None]
    if not waiting:
        return
    pool, prompt = rec.pool.value, rec.prompt_len.value
    need = prompt + rec.output_len.value * (1.0 + rec.output_spread.value)
    filled = statistics.median(d.running * need / pool for d in waiting)
    if filled >= FILLED:
        how = (
            f"an idle pool with a queue, no retraction, no request cap, and the running requests' prompts "
            f"and whole outputs fill {filled:.0%} of the pool while requests wait: each reserves its whole "
            "max_new_tokens (ignore_eos, as bench_serving sends by default) and generates all of it"
        )
        rec.reserves_all = Inferred(True, how, "estimate")
        rec.stops_early = Inferred(
            False, "ignore_eos: each request generates all its max_new_tokens", "estimate"
        )
        how = "ignore_eos: the mean max_new_tokens is the mean output"
        rec.max_new_tokens = Inferred(rec.output_len.value, how, "estimate")
        return
    held = sum(d.tokens or 0 for d in obs.decodes) / max(sum(d.running for d in obs.decodes if d.tokens), 1)
    age = max(held - prompt, 0.0)
    floor = RATIO_FLOOR_AT_1 * min(rec.conservativeness.value, 1 / 0.7)
    late = waiting[2 * len(waiting) // 3 :]
    budget = statistics.median((pool - (d.tokens or 0)) / d.running / floor + age for d in late)
    if budget <= rec.max_new_tokens.value:
        return
    how = (
        f"an idle pool with a queue: the running requests' prompts and outputs fill only {filled:.0%} of it; "
        f"the room left per running request at the ratio's floor {floor:.3f} (the last third of the waiting "
        f"lines), ÷ the floor, + the {age:,.0f} output tokens a running request holds"
    )
    rec.max_new_tokens = Inferred(budget, how, "guess")
    rec.stops_early = Inferred(True, f"mean output {rec.output_len.value:,.0f} well below it", "guess")

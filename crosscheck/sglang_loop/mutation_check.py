"""Show that a clean loop check is not vacuous: alter one of kvadmit's rules at a time (a monkeypatch in
this process only, the source untouched), rerun the kvadmit side and count the scenarios whose record now
differs from SGLang's. Every mutation that applies to the scenarios (the overlap ones to overlap-loop
scenarios, the 0.5.23 ones to 0.5.23 scenarios) must be caught (count > 0).

    python mutation_check.py SCENARIOS.jsonl SGLANG.jsonl [--only NAME,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The mutations patch kvadmit's Python functions and classes: never the compiled core (make fast), where a
# patched class method is refused or silently bypassed, and a module's functions call each other directly.
os.environ["KVADMIT_PURE_PYTHON"] = "1"

import compare
import kvadmit_side

from kvadmit.memory.radix import RadixCache
from kvadmit.memory.radix import _common_len as common_len
from kvadmit.request import FinishKind, FinishReason
from kvadmit.scheduler import ordering, policy, scheduler
from kvadmit.scheduler.admission import AdmissionPass
from kvadmit.scheduler.decode_memory import DecodeMemory
from kvadmit.scheduler.mixed_chunk import MixedChunk
from kvadmit.scheduler.preemption import PriorityPreemption
from kvadmit.scheduler.priority import PriorityScheduling
from kvadmit.scheduler.ratio import NewTokenRatio
from kvadmit.scheduler.results import StepResults


def _length_before_stop() -> Callable[[], None]:
    """The length cap checked before stop tokens (an EOS on the last allowed token ends as "length")."""
    original = StepResults._check_finished

    def check(self, req, token):
        if not req.abort_requested and len(req.output_ids) >= req.max_new_tokens:
            return FinishReason(FinishKind.LENGTH, matched=None)
        return original(self, req, token)

    StepResults._check_finished = check
    return lambda: setattr(StepResults, "_check_finished", original)


def _exact_page_eviction() -> Callable[[], None]:
    """Page size > 1: evict only the pages a step needs, not SGLang's fresh-page-per-request estimate."""
    original = scheduler.evict_for

    def evict(cache, pool, num_tokens):
        return None  # the per-request allocation still evicts what it needs

    scheduler.evict_for = evict
    return lambda: setattr(scheduler, "evict_for", original)


def _no_decay() -> Callable[[], None]:
    """The new-token ratio never decays between retractions."""
    original = NewTokenRatio.decay_step
    NewTokenRatio.decay_step = lambda self: None
    return lambda: setattr(NewTokenRatio, "decay_step", original)


def _reversed_retraction_order() -> Callable[[], None]:
    """Retraction takes the request with the most outputs first."""
    original = policy.POLICIES["sglang"]

    def order(reqs):
        return sorted(
            range(len(reqs)), key=lambda i: (len(reqs[i].output_ids), -len(reqs[i].origin_input_ids))
        )

    policy.POLICIES["sglang"] = dataclasses.replace(original, retraction_order=order)
    return lambda: policy.POLICIES.__setitem__("sglang", original)


def _no_idle_reset() -> Callable[[], None]:
    """The ratio is not reset when the engine runs dry."""
    original = NewTokenRatio.reset
    NewTokenRatio.reset = lambda self: None
    return lambda: setattr(NewTokenRatio, "reset", original)


def _lpm_capped_match() -> Callable[[], None]:
    """lpm matches the prompt + outputs capped at len - 1 (the tree splits there, not at the whole match)."""
    original = ordering.QueueOrder._sort_lpm

    def sort_lpm(self, waiting):
        real = self.cache.match_prefix

        def capped(key, end=None):
            return real(key, len(key) - 1 if end is None else min(end, len(key) - 1))

        self.cache.match_prefix = capped
        try:
            original(self, waiting)
        finally:
            del self.cache.match_prefix

    ordering.QueueOrder._sort_lpm = sort_lpm
    return lambda: setattr(ordering.QueueOrder, "_sort_lpm", original)


def _no_waiting_prefix_refresh() -> Callable[[], None]:
    """fcfs: the waiting requests' cached prefixes are never marked as just used."""
    original = ordering.QueueOrder._refresh_waiting_prefixes
    ordering.QueueOrder._refresh_waiting_prefixes = lambda self, waiting: None
    return lambda: setattr(ordering.QueueOrder, "_refresh_waiting_prefixes", original)


def _refresh_without_split() -> Callable[[], None]:
    """fcfs: the waiting-prefix refresh marks the cached path as used without splitting the node it ends
    inside (the older RadixCache's touch), so an untouched tail cannot be evicted apart from its head."""
    original = ordering.QueueOrder._refresh_waiting_prefixes

    def touch(cache, key):
        cache._tick += 1
        end = len(key) - len(key) % cache.page_size
        node, pos = cache.root, 0
        while pos < end:
            child = node.children.get(cache._child_key(key, pos))
            if child is None:
                break
            child.last_access = cache._tick
            cache._offer(child)
            n = common_len(child.key, key, pos, end, cache.page_size)
            if n < len(child.key):
                break
            node, pos = child, pos + n

    def refresh(self, waiting):
        self.cache.refresh_prefix = lambda key: touch(self.cache, key)
        try:
            original(self, waiting)
        finally:
            del self.cache.refresh_prefix

    ordering.QueueOrder._refresh_waiting_prefixes = refresh
    return lambda: setattr(ordering.QueueOrder, "_refresh_waiting_prefixes", original)


def _no_prompt_split() -> Callable[[], None]:
    """The cache keeps a path cached past the prompt as one node (no split where the prompt ends), so the
    prompt is evicted with the outputs."""
    original = RadixCache._split_at_prompt
    RadixCache._split_at_prompt = lambda self, req, inserted: None
    return lambda: setattr(RadixCache, "_split_at_prompt", original)


def _no_priority_preemption() -> Callable[[], None]:
    """Priority scheduling: a more urgent arrival never preempts running requests at the request cap."""
    original = PriorityPreemption.preempt_for
    PriorityPreemption.preempt_for = lambda self, candidate, adder, preempted: False
    return lambda: setattr(PriorityPreemption, "preempt_for", original)


def _priority_ignored_in_order() -> Callable[[], None]:
    """Priority scheduling with fcfs: the waiting queue stays in arrival order, priorities ignored."""
    original = PriorityScheduling.sort_fcfs
    PriorityScheduling.sort_fcfs = lambda self, waiting: None
    return lambda: setattr(PriorityScheduling, "sort_fcfs", original)


def _mixed_no_decode_rows() -> Callable[[], None]:
    """--enable-mixed-chunk: the running requests' decode rows never ride in a prefill batch (the
    admission budgets still take a token per running request)."""
    original = MixedChunk.mix_running
    MixedChunk.mix_running = lambda self, batch: batch
    return lambda: setattr(MixedChunk, "mix_running", original)


def _mixed_rows_free() -> Callable[[], None]:
    """--enable-mixed-chunk: the decode rows take nothing from the admission pass's budgets."""
    original = AdmissionPass.__init__

    def init(self, *args, **kwargs):
        kwargs["mixed_decode_tokens"] = 0
        original(self, *args, **kwargs)

    AdmissionPass.__init__ = init
    return lambda: setattr(AdmissionPass, "__init__", original)


def _ignore_eos_paged_chunk() -> Callable[[], None]:
    """ignore_eos without a cache: the prompt is measured and chunked in whole pages, as on the normal
    path (differs only when mixed decode rows leave the chunk budget off a page multiple)."""
    original = AdmissionPass._commit
    AdmissionPass._commit = lambda self, req, whole_pages=True: original(self, req, True)
    return lambda: setattr(AdmissionPass, "_commit", original)


def _overlap_no_skip() -> Callable[[], None]:
    """Overlap loop: a failed decode check retracts even when finishers in flight would free memory."""
    original = DecodeMemory.check_decode_or_retract

    def check(self, *args, **kwargs):
        kwargs["finishing_in_flight"] = False
        return original(self, *args, **kwargs)

    DecodeMemory.check_decode_or_retract = check
    return lambda: setattr(DecodeMemory, "check_decode_or_retract", original)


def _overlap_unlagged_finishers() -> Callable[[], None]:
    """Overlap loop: requests finishing in flight are judged on their outputs without the lagging token."""
    original = DecodeMemory._finishing_in_flight

    def finishing(self):
        self._dropped_finishing = []
        if self.in_flight is None:
            return []
        in_batch = set(map(id, self.in_flight.reqs))
        self._dropped_finishing = [r for r in self.running.due_within(0) if id(r) in in_batch]
        return self._dropped_finishing

    DecodeMemory._finishing_in_flight = finishing
    return lambda: setattr(DecodeMemory, "_finishing_in_flight", original)


def _profile_off(field: str) -> Callable[[], Callable[[], None]]:
    """0.5.23: one of its rule changes switched off (the scheduler keeps 0.5.22's rule there)."""

    def mutate() -> Callable[[], None]:
        original = scheduler.Scheduler.__init__

        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self.profile = dataclasses.replace(self.profile, **{field: False})

        scheduler.Scheduler.__init__ = init
        return lambda: setattr(scheduler.Scheduler, "__init__", original)

    return mutate


# Rules that change a decision only in rare sequences: a file where such a mutation changes nothing is
# reported, not failed. `no-prompt-split` needs a request prefilled again with its outputs whose prompt then
# outlives its outputs in the cache and is matched; the full suite (README.md) catches it in one scenario
# of each overlap row and in none of the normal rows.
RARE = {"no-prompt-split"}

# name -> (mutation, applies to a scenario's server)
MUTATIONS: dict[str, tuple[Callable[[], Callable[[], None]], Callable[[dict], bool]]] = {
    "length-before-stop": (_length_before_stop, lambda s: True),
    "exact-page-eviction": (_exact_page_eviction, lambda s: True),
    "no-ratio-decay": (_no_decay, lambda s: True),
    "reversed-retraction-order": (_reversed_retraction_order, lambda s: True),
    "no-idle-ratio-reset": (_no_idle_reset, lambda s: True),
    "lpm-capped-match": (_lpm_capped_match, lambda s: s["schedule_policy"] == "lpm"),
    "no-waiting-prefix-refresh": (_no_waiting_prefix_refresh, lambda s: s["schedule_policy"] != "lpm"),
    "refresh-without-split": (
        _refresh_without_split,
        lambda s: s["schedule_policy"] != "lpm" and not s["disable_radix_cache"],
    ),
    "no-prompt-split": (_no_prompt_split, lambda s: not s["disable_radix_cache"]),
    "no-priority-preemption": (_no_priority_preemption, lambda s: bool(s.get("enable_priority_scheduling"))),
    "priority-ignored-in-order": (
        _priority_ignored_in_order,
        lambda s: bool(s.get("enable_priority_scheduling")),
    ),
    "mixed-no-decode-rows": (_mixed_no_decode_rows, lambda s: bool(s.get("enable_mixed_chunk"))),
    "mixed-rows-free-budget": (_mixed_rows_free, lambda s: bool(s.get("enable_mixed_chunk"))),
    "ignore-eos-paged-chunk": (
        _ignore_eos_paged_chunk,
        lambda s: bool(s.get("enable_mixed_chunk")) and s["disable_radix_cache"] and s["page_size"] > 1,
    ),
    "overlap-no-skip-on-finishers": (_overlap_no_skip, lambda s: s["overlap"]),
    "overlap-unlagged-finishers": (_overlap_unlagged_finishers, lambda s: s["overlap"]),
    "0.5.23-no-per-pass-filter": (
        _profile_off("filter_finished_every_pass"),
        lambda s: s.get("sglang_version") == "0.5.23",
    ),
    "0.5.23-no-budget-spent-stop": (
        _profile_off("stop_admission_when_budget_spent"),
        lambda s: s.get("sglang_version") == "0.5.23",
    ),
    "0.5.23-no-held-row-credit": (
        _profile_off("credit_held_rows"),
        lambda s: s.get("sglang_version") == "0.5.23",
    ),
}


def run(scenarios: list[dict], sglang: list[dict], name: str) -> int:
    undo = MUTATIONS[name][0]()
    try:
        differing = 0
        for sc, sg in zip(scenarios, sglang, strict=True):
            try:
                kv = kvadmit_side.run_scenario(sc)
            except Exception as e:  # a mutated rule may break the engine: that is caught too
                kv = {"id": sc["id"], "error": f"{type(e).__name__}: {e}"}
            if compare.compare_one(sg, kv):
                differing += 1
        return differing
    finally:
        undo()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenarios")
    ap.add_argument("sglang")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    scenarios, sglang = compare.read_jsonl(a.scenarios), compare.read_jsonl(a.sglang)
    servers = [sc["server"] for sc in scenarios]
    names = [n for n in a.only.split(",") if n] or [
        n for n, (_, applies) in MUTATIONS.items() if any(applies(s) for s in servers)
    ]
    missed: list[str] = []
    caught = 0
    for name in names:
        n = run(scenarios, sglang, name)
        rare = " (acts rarely: not required in every file)" if name in RARE and n == 0 else ""
        print(f"mutation {name:<28} {n:>5} of {len(scenarios)} scenarios differ{rare}")
        caught += n > 0
        if n == 0 and not rare:
            missed.append(name)
    if missed:
        print(f"mutation check: NOT caught: {', '.join(missed)}")
        return 1
    print(f"mutation check: {caught} of {len(names)} mutations caught, every required one")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

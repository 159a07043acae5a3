"""Show that a clean loop check is not vacuous: alter one of kvadmit's rules at a time (a monkeypatch in
this process only, the source untouched), rerun the kvadmit side and count the scenarios whose record now
differs from SGLang's. Every mutation must be caught (count > 0).

    python mutation_check.py SCENARIOS.jsonl SGLANG.jsonl [--only NAME,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare  # noqa: E402
import kvadmit_side  # noqa: E402
from kvadmit.request import FinishKind, FinishReason  # noqa: E402
from kvadmit.scheduler import policy, scheduler  # noqa: E402
from kvadmit.scheduler.ratio import NewTokenRatio  # noqa: E402
from kvadmit.scheduler.results import StepResults  # noqa: E402


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
        return sorted(range(len(reqs)), key=lambda i: (len(reqs[i].output_ids), -len(reqs[i].origin_input_ids)))

    policy.POLICIES["sglang"] = dataclasses.replace(original, retraction_order=order)
    return lambda: policy.POLICIES.__setitem__("sglang", original)


def _no_idle_reset() -> Callable[[], None]:
    """The ratio is not reset when the engine runs dry."""
    original = NewTokenRatio.reset
    NewTokenRatio.reset = lambda self: None
    return lambda: setattr(NewTokenRatio, "reset", original)


MUTATIONS: dict[str, Callable[[], Callable[[], None]]] = {
    "length-before-stop": _length_before_stop,
    "exact-page-eviction": _exact_page_eviction,
    "no-ratio-decay": _no_decay,
    "reversed-retraction-order": _reversed_retraction_order,
    "no-idle-ratio-reset": _no_idle_reset,
}


def run(scenarios: list[dict], sglang: list[dict], name: str) -> int:
    undo = MUTATIONS[name]()
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
    scenarios = [json.loads(x) for x in open(a.scenarios) if x.strip()]
    sglang = [json.loads(x) for x in open(a.sglang) if x.strip()]
    names = [n for n in a.only.split(",") if n] or list(MUTATIONS)
    missed = []
    for name in names:
        n = run(scenarios, sglang, name)
        print(f"mutation {name:<28} {n:>5} of {len(scenarios)} scenarios differ")
        if n == 0:
            missed.append(name)
    if missed:
        print(f"mutation check: NOT caught: {', '.join(missed)}")
        return 1
    print(f"mutation check: all {len(names)} mutations caught")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

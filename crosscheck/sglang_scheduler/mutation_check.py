"""Sensitivity check, so that "0 mismatches" is not vacuous: answer the snapshots with SGLang carrying
two small, deliberate rule changes and count the snapshots where its answer now differs from kvadmit's.
A suite that reaches the thresholds must show disagreements; exits 1 when it shows none.

The two changes (monkeypatched in this process only; SGLang's files are untouched):
* PrefillBudget.check_prefill: the strict `total_tokens < remaining_total` fit test becomes `<=`;
* ScheduleBatch._get_decode_retraction_order: the order is flipped on its main key. SGLang retracts the
  request with the fewest output tokens first; the mutant retracts the one with the most (ties: longest
  prompt first in both).

    $VENV/bin/python mutation_check.py SNAPSHOTS.jsonl KVADMIT.jsonl
"""

import json
import sys

import harness  # first: it installs the stand-ins SGLang's imports need
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.mem_cache.prefill_budget import PrefillBudget


def check_prefill_le(
    self, *, extend_input_len, total_tokens, max_new_tokens, input_tokens, swa_host_hit_length, chunk_limit
):
    return (True, chunk_limit) if total_tokens <= self.remaining_total else (False, None)


def retraction_order_reversed(reqs):
    return sorted(range(len(reqs)), key=lambda i: (len(reqs[i].output_ids), len(reqs[i].origin_input_ids)))


def mutate():
    PrefillBudget.check_prefill = check_prefill_le
    ScheduleBatch._get_decode_retraction_order = staticmethod(retraction_order_reversed)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    mutate()
    n = differ = 0
    with open(sys.argv[1]) as snaps, open(sys.argv[2]) as kvadmit:
        for ls, lk in zip(snaps, kvadmit, strict=True):
            s, k = json.loads(ls), json.loads(lk)
            try:
                g = harness.answer(s)
            except Exception as e:
                g = {"error": f"{type(e).__name__}: {e}"}
            n += 1
            differ += any(g[f] != k.get(f) for f in g)
    print(f"mutated SGLang vs kvadmit: {differ} of {n} differ")
    sys.exit(0 if differ else 1)


if __name__ == "__main__":
    main()

"""Search for last-request aborts under extreme memory pressure, on kvadmit's side (fast), and write every
scenario that produces one, so that it can be run through SGLang's loop (sglang_side.py) and compared.

    python abort_search.py SEED COUNT > found.jsonl      # prints "found N of COUNT" on stderr

The scenarios are gen.py's, squeezed: pools of 48 to 128 tokens, pages of 1, 2 or 16, chunked prefill off
or of one or two pages, 16 or 32 tokens, schedule conservativeness 0.05 to 0.3 with a fast ratio decay,
outputs of up to 1,000 tokens, both loops and versions, priority scheduling and mixed chunks for 40% each.
README.md (Limits) says why none is expected: nothing holds KV outside a decode batch of one request.
"""

from __future__ import annotations

import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gen
import kvadmit_side


def squeezed(seed: int, k: int) -> dict:
    rng = random.Random(seed * 100_000 + k)
    overlap, version = rng.random() < 0.5, rng.choice(["0.5.22", "0.5.23"])
    sc = gen.scenario(rng, f"a{seed}-{k}", overlap, version, 0.05)
    s = sc["server"]
    page = rng.choice([1, 2, 16])
    s["page_size"] = page
    s["max_total_tokens"] = max(rng.choice([48, 64, 96, 128]) // page * page, 4 * page)
    chunk = rng.choice([None, page, 2 * page, 16, 32])
    s["chunked_prefill_size"] = max(chunk, page) if chunk is not None else None
    s["schedule_conservativeness"] = rng.choice([0.05, 0.1, 0.3])
    s["env"] = {
        "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": str(rng.choice([5, 20])),
        "SGLANG_RETRACT_DECODE_STEPS": str(rng.choice([1, 5, 20])),
    }
    if rng.random() < 0.4:
        s["enable_mixed_chunk"] = True
        if s["chunked_prefill_size"] is None:
            s["chunked_prefill_size"] = 16 * page
    if rng.random() < 0.4:
        s["schedule_policy"] = "fcfs"
        s["enable_priority_scheduling"] = True
        for r in sc["requests"]:
            r["priority"] = rng.choice([None, 0, 1, 5, 12, 20, 30])
    for r in sc["requests"]:
        r["max_new_tokens"] = rng.choice([r["max_new_tokens"], 1000, 300])
    return sc


def main() -> int:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    found = 0
    for k in range(count):
        sc = squeezed(seed, k)
        aborts = [e for e in kvadmit_side.run_scenario(sc)["events"] if e[0] == "A"]
        if aborts:
            found += 1
            print(json.dumps(sc), flush=True)
            print(f"{sc['id']}: last-request aborts {aborts}", file=sys.stderr)
    print(f"found {found} of {count}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Threshold-centred variants of gen.py's random (larger) admission snapshots: the pool is set so that
the free count sits within ±3 of the first candidate's fit threshold (normal path and ignore_eos path),
then of the threshold where the pass's budget_state flips after admitting it (21 snapshots a base).

    python gen_medium.py SEED BASES OUT.jsonl [--unaligned]

The same arguments always write the same file.
"""

import argparse
import copy
import json
import math
import random

from gen import gen_one


def reservation(snap, clip):
    ratio = snap["new_token_ratio"]
    if ratio is None:
        srv = snap["server"]
        init = float((srv.get("env") or {}).get("SGLANG_INIT_NEW_TOKEN_RATIO", 0.7))
        ratio = min(init * srv.get("schedule_conservativeness", 1.0), 1.0)
    total = 0
    for r in snap["running"]:
        rr = 1.0 if r["ignore_eos"] else ratio
        total += min(r["max_new_tokens"] - r["output_len"], clip) * rr
    return total


def variants(rng, base):
    srv = base["server"]
    P = srv["page_size"]
    clip = int((srv.get("env") or {}).get("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", 4096))
    held = sum(r["prompt_len"] + r["output_len"] for r in base["running"])
    ev = base["evictable_tokens"]
    res = reservation(base, clip)
    w = base["waiting"][0]
    ln = w["prompt_len"] + w["output_len"]
    mn = min(max(w["max_new_tokens"] - w["output_len"], 0), clip)
    targets = []
    # normal path: ln + mn + P < free + ev - res
    targets.append(ln + mn + P + res - ev)
    # ignore_eos path: ceil(ln) + P <= min(free, free - res) with the radix cache off
    paged = -(-ln // P) * P + P
    targets.append(paged + max(res, 0))
    # after admitting it: rem_total = free + ev - res - (ceil(ext)+P+min(mn_full,clip)) hits 0
    charge = -(-ln // P) * P + P + min(w["max_new_tokens"], clip)
    targets.append(res - ev + charge)
    out = []
    for t in targets:
        base_free = math.ceil(t)
        for k in range(-3, 4):
            free = base_free + k
            if free < 0:
                continue
            s = copy.deepcopy(base)
            s["server"]["max_total_tokens"] = held + ev + free
            out.append(s)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seed", type=int)
    ap.add_argument("bases", type=int)
    ap.add_argument("out")
    ap.add_argument("--unaligned", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    n = 0
    with open(args.out, "w") as f:
        while n < args.bases:
            base = gen_one(rng, False, args.unaligned)
            if not base["waiting"]:
                continue
            n += 1
            for s in variants(rng, base):
                f.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()

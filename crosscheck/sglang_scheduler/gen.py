"""Random snapshots (docs/architecture.md, "The snapshot format") for the differential check: mixed pool
sizes (64 to
20,000 tokens), page sizes 1/4/16, radix cache on and off, chunking on and off, request caps, SGLANG_*
env knobs, retracted waiting requests, and decode snapshots packed close to a full pool.

    python gen.py SEED COUNT OUT.jsonl [--decode-fraction 0.35] [--unaligned]

With page_size > 1, cached prefixes and evictable_tokens are page multiples: SGLang's paged radix
tree cannot hold a partial page, so other states have no SGLang counterpart. --unaligned lifts that
(harness.py then keeps the partial pages as extra evictable tokens; use it for admission only).
The same arguments always write the same file.
"""

import argparse
import json
import random


def maybe_env(rng, server):
    if rng.random() < 0.15:
        env = {}
        if rng.random() < 0.7:
            env["SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"] = rng.choice([0, 1, 5, 8, 20, 50, 300])
        if rng.random() < 0.5:
            env["SGLANG_RETRACT_DECODE_STEPS"] = rng.choice([0, 1, 5, 50, 100])
        if rng.random() < 0.3:
            env["SGLANG_INIT_NEW_TOKEN_RATIO"] = rng.choice([0.5, 0.9, 0.25, 1.5])
        server["env"] = env


def ratio_choice(rng):
    k = rng.random()
    if k < 0.25:
        return rng.choice([0.5, 0.25, 1.0, 0.125, 0.75, 0.0625])  # exact binary fractions
    if k < 0.45:
        return rng.choice([0.7, 0.098, 0.3, 0.1, 0.9998, 0.6, 0.35])
    if k < 0.55:
        return None
    return round(rng.uniform(0.05, 1.0), rng.choice([2, 4, 8, 17]))


def gen_one(rng, decode, unaligned=False):
    P = rng.choice([1, 1, 4, 16])
    small = rng.random() < 0.45
    if small:
        pool = rng.randint(max(64, 4 * P), 400)
    else:
        pool = round(10 ** rng.uniform(2.2, 4.301))
        pool = max(64, min(20000, pool))
    pool = max(pool, 4 * P)
    radix = rng.random() < 0.7
    chunk_mode = rng.random()
    if chunk_mode < 0.35:
        chunk = None
    elif chunk_mode < 0.7:
        chunk = (
            rng.choice([P, 2 * P, 16, 32, 48, 64, 100, 128, 256])
            if small
            else rng.choice([64, 256, 512, 1000, 2048])
        )
    else:
        chunk = rng.choice([8192, 4096, 2048])
    if chunk is not None and chunk > 0:
        chunk = max(P, (chunk // P) * P)
    if chunk is not None and rng.random() < 0.05:
        chunk = rng.choice([0, -1])
    mpt_mode = rng.random()
    if mpt_mode < 0.4:
        mpt = 16384
    elif mpt_mode < 0.8:
        mpt = rng.randint(1, max(2, pool // 3))
    else:
        mpt = rng.choice([P, 16, 32, 100, 512])
    mrr = None
    if rng.random() < 0.35:
        mrr = rng.randint(1, 12)
    pmr = None
    if rng.random() < 0.2:
        pmr = rng.randint(1, 4)
    context_len = pool
    cap = (
        min(mrr, pool // 2)
        if mrr is not None
        else min(max(min(int(pool / context_len * 512), 4096), 2048), pool // 2)
    )
    server = {
        "max_total_tokens": pool,
        "page_size": P,
        "schedule_conservativeness": rng.choice([1.0, 1.0, 0.3, 1.3, 0.5]),
        "max_running_requests": mrr,
        "max_prefill_tokens": mpt,
        "chunked_prefill_size": chunk,
        "disable_radix_cache": not radix,
    }
    if pmr is not None:
        server["prefill_max_requests"] = pmr
    maybe_env(rng, server)

    # running requests
    n_run = rng.randint(0, 30)
    if decode:
        n_run = max(1, n_run) if rng.random() < 0.85 else 1
    if mrr is not None:
        n_run = rng.randint(0 if not decode else 1, cap) if rng.random() < 0.85 else cap
    n_run = min(n_run, cap)
    budget_frac = rng.uniform(0.0, 0.95) if not decode else rng.uniform(0.6, 1.0)
    hold_budget = int(pool * budget_frac)
    running = []
    used = 0
    eos_mix = rng.random()
    for j in range(n_run):
        remaining = hold_budget - used
        if remaining < 2:
            break
        share = max(2, remaining // max(1, (n_run - j)))
        tot = (
            rng.randint(1 if share <= 2 else share // 2, share)
            if rng.random() < 0.8
            else rng.randint(1, max(1, remaining))
        )
        tot = max(1, min(tot, remaining))
        prompt = rng.randint(1, tot)
        out = tot - prompt
        if rng.random() < 0.2:
            # make committed length a page multiple sometimes (decode needs a new page)
            tot2 = (tot // P) * P
            if tot2 >= 1:
                prompt = min(prompt, tot2)
                out = tot2 - prompt
                tot = tot2
        mn = out + rng.choice(
            [
                0,
                1,
                2,
                rng.randint(1, 16),
                rng.randint(1, 64),
                rng.randint(1, max(1, pool // 20)),
                rng.randint(1, max(1, pool // 4)),
                rng.randint(1, 6000),
            ]
        )
        if rng.random() < 0.05:
            mn = rng.randint(4097, 9000) + out
        running.append(
            {
                "rid": f"r{j}",
                "prompt_len": prompt,
                "output_len": out,
                "max_new_tokens": mn,
                "ignore_eos": rng.random() < eos_mix,
            }
        )
        used += prompt + out
    held = sum(r["prompt_len"] + r["output_len"] for r in running)
    left = pool - held

    # evictable
    if decode and rng.random() < 0.6:
        free_target = rng.choice([0, 0, 1, 2, P - 1 if P > 1 else 0, rng.randint(0, 3 * P + 3)])
        free_target = min(free_target, left)
        ev_max = left - free_target
        evictable = rng.choice([0, rng.randint(0, min(ev_max, 3 * P + 40))]) if ev_max > 0 else 0
        # the rest goes to the running requests' holdings, by growing the last one's prompt
        spare = left - free_target - evictable
        if running and spare > 0:
            running[-1]["prompt_len"] += spare
    else:
        evictable = rng.randint(0, left) if rng.random() < 0.6 else rng.randint(0, max(0, left // 8))
    if P > 1 and not unaligned:
        evictable = (evictable // P) * P

    # waiting
    n_wait = (
        rng.choice([rng.randint(1, 3), rng.randint(1, 10), rng.randint(1, 30)])
        if not decode
        else rng.randint(0, 6)
    )
    waiting = []
    ev_left = evictable if radix else 0
    ratio_guess = 0.7
    reserve = sum(
        (r["max_new_tokens"] - r["output_len"]) * (1.0 if r["ignore_eos"] else ratio_guess) for r in running
    )
    room = max(1, int(pool - held - reserve))
    size_scale = max(1, room // max(1, rng.choice([1, 2, 4, 8, n_wait, 2 * n_wait])))
    for i in range(n_wait):
        prompt = rng.randint(1, max(1, int(size_scale * rng.uniform(0.05, 1.0))))
        out = 0
        if rng.random() < 0.15:
            out = rng.randint(1, max(1, prompt))
        mn = rng.choice(
            [
                0,
                1,
                rng.randint(1, 32),
                rng.randint(1, max(1, size_scale)),
                rng.randint(1, max(1, size_scale // 4)),
                rng.randint(1, max(1, size_scale // 16)),
                rng.randint(1, 5000),
            ]
        )
        if out:
            mn = max(mn, out + rng.choice([0, 0, 1, 5, 100]))
            if rng.random() < 0.2:
                mn = max(0, out - rng.randint(0, out))  # max_new below outputs already made
        if rng.random() < 0.04:
            mn = rng.randint(4097, 10000)
        cached = 0
        if (ev_left > 0 or not radix) and rng.random() < 0.5:
            lim = prompt + out
            if rng.random() < 0.3:
                c = lim  # whole prompt(+outputs) cached
            elif rng.random() < 0.2:
                c = prompt  # whole prompt cached
            else:
                c = rng.randint(1, lim)
            if P > 1 and not unaligned:
                c = (c // P) * P
            c = min(c, lim)
            if radix:
                c = min(c, ev_left if (P == 1 or unaligned) else (ev_left // P) * P)
                ev_left -= c
            else:
                c = 0 if rng.random() < 0.7 else c
            cached = c
        waiting.append(
            {
                "rid": f"w{i}",
                "prompt_len": prompt,
                "cached_prefix_len": cached,
                "max_new_tokens": mn,
                "ignore_eos": rng.random() < eos_mix,
                "output_len": out,
            }
        )
    snap = {
        "server": server,
        "new_token_ratio": ratio_choice(rng),
        "evictable_tokens": evictable,
        "running": running,
        "waiting": waiting,
    }
    if decode:
        snap["check"] = "decode"
    return snap


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seed", type=int)
    ap.add_argument("count", type=int)
    ap.add_argument("out")
    ap.add_argument("--decode-fraction", type=float, default=0.35)
    ap.add_argument("--unaligned", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w") as f:
        for _ in range(args.count):
            snap = gen_one(rng, rng.random() < args.decode_fraction, args.unaligned)
            f.write(json.dumps(snap) + "\n")


if __name__ == "__main__":
    main()

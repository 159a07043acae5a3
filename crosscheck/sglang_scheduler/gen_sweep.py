"""Boundary sweeps: small random base snapshots, then one knob swept in unit steps so that every
threshold (strict fit test, budget_state, ignore_eos occupancy, chunk limit, prefill budget, decode
page need, abort) is crossed exactly. Each admission base gives ~650 snapshots (pool size,
max_prefill_tokens, chunked_prefill_size, the first waiting request's max_new_tokens); each decode
base gives 60 (pool size).

    python gen_sweep.py SEED BASES OUT.jsonl [--decode-fraction 0.3] [--focus paged_prefix]

--focus paged_prefix: page sizes 2-16, radix cache on, most waiting requests with a cached prefix.
The same arguments always write the same file.
"""

import argparse
import copy
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


FOCUS = ""  # set by main() from --focus


def tiny_base(rng, decode):
    P = rng.choice([1, 1, 1, 4, 16])
    radix = rng.random() < 0.6
    if FOCUS == "paged_prefix":
        P, radix = rng.choice([2, 4, 8, 16]), True
    n_run = rng.randint(0 if not decode else 1, 6)
    running = []
    for j in range(n_run):
        prompt = rng.randint(1, 40)
        out = rng.randint(0, 30)
        if rng.random() < 0.3 and P > 1:
            tot = max(P, ((prompt + out) // P) * P)
            prompt = max(1, min(prompt, tot))
            out = tot - prompt
        mn = out + rng.choice([0, 1, rng.randint(0, 8), rng.randint(0, 40)])
        if rng.random() < 0.1:
            mn = max(0, out - rng.randint(0, 3))  # no more to generate
        running.append(
            {
                "rid": f"r{j}",
                "prompt_len": prompt,
                "output_len": out,
                "max_new_tokens": mn,
                "ignore_eos": rng.random() < 0.5,
            }
        )
    n_wait = rng.randint(1, 6) if not decode else rng.randint(0, 3)
    waiting = []
    cached_total = 0
    for i in range(n_wait):
        prompt = rng.randint(1, 48)
        out = rng.randint(1, 20) if rng.random() < 0.25 else 0
        mn = rng.choice([0, 1, rng.randint(0, 10), rng.randint(0, 48)])
        if out and rng.random() < 0.6:
            mn = out + rng.randint(-min(out, 3), 10)
        c = 0
        if rng.random() < (0.9 if FOCUS == "paged_prefix" else 0.5):
            c = rng.choice([prompt + out, prompt, rng.randint(0, prompt + out)])
            if P > 1:
                c = (c // P) * P
            if not radix and rng.random() < 0.7:
                c = 0
        cached_total += c if radix else 0
        waiting.append(
            {
                "rid": f"w{i}",
                "prompt_len": prompt,
                "cached_prefix_len": c,
                "max_new_tokens": mn,
                "ignore_eos": rng.random() < 0.5,
                "output_len": out,
            }
        )
    extra = rng.choice([0, 0, rng.randint(0, 20)])
    if P > 1:
        extra = (extra // P) * P
    evictable = cached_total + extra if radix else rng.choice([0, extra])
    held = sum(r["prompt_len"] + r["output_len"] for r in running)
    chunk = rng.choice([None, None, P, 2 * P, 8, 16, 24, 32, 64, 8192])
    if chunk is not None:
        chunk = max(P, (chunk // P) * P)
    mrr = rng.choice([None, None, None, n_run + rng.randint(0, 3)])
    if mrr is not None:
        mrr = max(1, mrr)
    server = {
        "max_total_tokens": held + evictable + rng.randint(0, 10),
        "page_size": P,
        "schedule_conservativeness": rng.choice([1.0, 0.3, 1.3]),
        "max_running_requests": mrr,
        "max_prefill_tokens": rng.choice([16384, rng.randint(1, 80)]),
        "chunked_prefill_size": chunk,
        "disable_radix_cache": not radix,
    }
    if rng.random() < 0.15:
        server["prefill_max_requests"] = rng.randint(1, 3)
    maybe_env(rng, server)
    if not decode and FOCUS != "paged_prefix" and rng.random() < 0.25:
        # ignore_eos path focus: radix off, ignore_eos candidates with varied max_new_tokens
        server["disable_radix_cache"] = True
        for w in waiting:
            w["ignore_eos"] = rng.random() < 0.9
            w["max_new_tokens"] = rng.randint(0, 60)
            w["cached_prefix_len"] = 0
        snap_ev = rng.choice([0, extra])
        server["max_total_tokens"] += snap_ev - evictable
        evictable = snap_ev
    snap = {
        "server": server,
        "new_token_ratio": rng.choice([0.5, 1.0, 0.25, 0.75, 0.7, None, 0.3, round(rng.random(), 3)]),
        "evictable_tokens": evictable,
        "running": running,
        "waiting": waiting,
    }
    if decode:
        snap["check"] = "decode"
    return snap


def sweeps(rng, base):
    out = []
    decode = base.get("check") == "decode"
    held = sum(r["prompt_len"] + r["output_len"] for r in base["running"])
    lo = held + base["evictable_tokens"]
    # 1. pool size (= free tokens) in unit steps
    width = 60 if decode else 260
    for k in range(0, width):
        s = copy.deepcopy(base)
        s["server"]["max_total_tokens"] = lo + k
        out.append(s)
    if decode:
        return out
    # 2. max_prefill_tokens
    for v in range(1, 120, 1 if rng.random() < 0.5 else 3):
        s = copy.deepcopy(base)
        s["server"]["max_prefill_tokens"] = v
        s["server"]["max_total_tokens"] = lo + rng.randint(60, 300)
        out.append(s)
    # 3. chunked_prefill_size
    P = base["server"]["page_size"]
    pool = lo + rng.randint(60, 300)
    for v in range(P, 130, P):
        s = copy.deepcopy(base)
        s["server"]["chunked_prefill_size"] = v
        s["server"]["max_total_tokens"] = pool
        out.append(s)
    # 4. the first waiting request's max_new_tokens
    if base["waiting"]:
        pool = lo + rng.randint(20, 200)
        for v in range(0, 200):
            s = copy.deepcopy(base)
            s["waiting"][0]["max_new_tokens"] = v
            s["server"]["max_total_tokens"] = pool
            out.append(s)
    return out


def main():
    global FOCUS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seed", type=int)
    ap.add_argument("bases", type=int)
    ap.add_argument("out")
    ap.add_argument("--decode-fraction", type=float, default=0.3)
    ap.add_argument("--focus", choices=["", "paged_prefix"], default="")
    args = ap.parse_args()
    FOCUS = args.focus
    rng = random.Random(args.seed)
    with open(args.out, "w") as f:
        for _ in range(args.bases):
            base = tiny_base(rng, rng.random() < args.decode_fraction)
            for s in sweeps(rng, base):
                f.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()

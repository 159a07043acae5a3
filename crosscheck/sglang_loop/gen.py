"""Random loop scenarios: server flags and a request script. The same arguments always write the same file.

    python gen.py SEED COUNT [--overlap 0|1] [--version 0.5.22] [--abort-fraction F]
                  [--priority SHARE] [--mixed SHARE] > scenarios.jsonl

--priority and --mixed give the share of scenarios (0 to 1, each drawn on its own) that run with priority
scheduling (fcfs, priorities None, 0, 1, 5, 12, 20, 30) and with --enable-mixed-chunk.

A scenario (one JSON line):
  server:   max_total_tokens, page_size, chunked_prefill_size (None: off), max_prefill_tokens,
            max_running_requests (None: SGLang's default), schedule_conservativeness, disable_radix_cache,
            schedule_policy (fcfs | lpm), decode_log_interval, context_length, overlap, sglang_version,
            env (optional SGLANG_* knobs: the ratio's decay steps, the retraction's decode steps)
  requests: rid (fixed width, so that no rid is a prefix of another: SGLang's abort matches prefixes),
            input_ids (some share a prefix with an earlier request), max_new_tokens, ignore_eos,
            eos_at (the output index at which the stub model emits EOS, or None: never),
            arrive_after (the request reaches the scheduler before the pass that follows the k-th launched
            batch; when the engine runs dry first, it comes then), abort_after (a client abort at the same
            kind of moment, or None).
Pools are small for the load, so that retractions and last-request aborts happen often.
"""

from __future__ import annotations

import argparse
import json
import random


def scenario(rng: random.Random, sid: str, overlap: bool, version: str, abort_fraction: float) -> dict:
    page = rng.choice([1, 1, 1, 2, 4, 16])
    pool = rng.choice([48, 64, 96, 128, 160, 192, 256, 384, 512, 1024])
    pool = max(pool, 8 * page)
    pool -= pool % page
    chunk = rng.choice([None, None, 16, 32, 64, 128, 256, 512])
    if chunk is not None:
        chunk = max(chunk, page)
    server = {
        "max_total_tokens": pool,
        "page_size": page,
        "chunked_prefill_size": chunk,
        "max_prefill_tokens": rng.choice([16384, 16384, 64, 128, 256, 512, 1024]),
        "max_running_requests": rng.choice([None, None, None, 1, 2, 3, 4, 8, 16]),
        "schedule_conservativeness": rng.choice([1.0, 1.0, 0.1, 0.2, 0.3, 0.5, 0.8, 1.3, 2.0]),
        "disable_radix_cache": rng.random() < 0.3,
        "schedule_policy": rng.choice(["fcfs", "fcfs", "lpm"]),
        "decode_log_interval": rng.randint(1, 5),
        "context_length": rng.choice([32768, 32768, pool // 2 + rng.randint(8, 64)]),
        "overlap": overlap,
        "sglang_version": version,
    }
    n = rng.randint(1, 32)
    burst = rng.random() < 0.5  # most requests at once: the pool fills, retraction follows
    # Under pressure, admission is optimistic and outputs run long: decode runs out of memory.
    pressure = rng.random() < 0.5
    if pressure:
        server["schedule_conservativeness"] = rng.choice([0.05, 0.1, 0.2, 0.3])
        # A fast decay brings admission back to optimism soon after a retraction: more retractions.
        server["env"] = {
            "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": str(rng.choice([600, 50, 20, 5])),
            "SGLANG_RETRACT_DECODE_STEPS": str(rng.choice([20, 20, 5, 1])),
        }
    prompts: list[list[int]] = []
    requests = []
    arrive = 0
    next_token = 100
    for i in range(n):
        plen = rng.randint(1, max(2, min(pool // 4, rng.choice([4, 8, 16, 32, 64, 128]))))
        ids: list[int] = []
        if prompts and rng.random() < 0.35:
            base = rng.choice(prompts)
            ids = base[: rng.randint(1, len(base))]
        while len(ids) < plen:
            ids.append(next_token)
            next_token += 1
        ids = ids[:plen] if len(ids) > plen else ids
        prompts.append(ids)
        max_new = rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 256, rng.randint(1, 300)])
        if pressure:
            max_new = rng.choice([32, 64, 128, 256, rng.randint(16, 300)])
        eos_at = None
        if rng.random() < (0.15 if pressure else 0.5):
            eos_at = rng.randint(0, max(0, max_new + 2))
        arrive += rng.choice([0, 0, 0, 0, 0, 1]) if burst else rng.choice([0, 0, 0, 1, 2, 3, 5, 10, 20])
        abort_after = None
        if rng.random() < abort_fraction:
            abort_after = arrive + rng.randint(0, 30)
        requests.append(
            {
                "rid": f"r{i:03d}",
                "input_ids": ids,
                "max_new_tokens": max_new,
                "ignore_eos": rng.random() < 0.4,
                "eos_at": eos_at,
                "arrive_after": arrive,
                "abort_after": abort_after,
            }
        )
    return {"id": sid, "server": server, "requests": requests}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("seed", type=int)
    ap.add_argument("count", type=int)
    ap.add_argument("--overlap", type=int, default=0)
    ap.add_argument("--version", default="0.5.22")
    ap.add_argument("--abort-fraction", type=float, default=0.0)
    ap.add_argument(
        "--priority", type=float, default=0.0, help="share of scenarios with priority scheduling (1: all)"
    )
    ap.add_argument(
        "--mixed", type=float, default=0.0, help="share of scenarios with --enable-mixed-chunk (1: all)"
    )
    a = ap.parse_args()
    rng = random.Random(a.seed)
    for k in range(a.count):
        sc = scenario(rng, f"{a.seed}-{k}", bool(a.overlap), a.version, a.abort_fraction)
        # Which features a scenario gets comes from a generator of its own, so that a share of 0 or 1
        # leaves the main stream (and so every scenario of an older run) exactly as it was.
        pick = random.Random(a.seed * 1_000_003 + k)
        priority, mixed = pick.random() < a.priority, pick.random() < a.mixed
        if priority:
            # Priority scheduling works with fcfs and lof; preemption needs a gap above its threshold (10).
            sc["server"]["schedule_policy"] = "fcfs"
            sc["server"]["enable_priority_scheduling"] = True
            for r in sc["requests"]:
                r["priority"] = rng.choice([None, 0, 1, 5, 12, 20, 30])
        if mixed:
            sc["server"]["enable_mixed_chunk"] = True
            if sc["server"]["chunked_prefill_size"] is None:  # mixed chunks need chunked prefill
                sc["server"]["chunked_prefill_size"] = sc["server"]["page_size"] * rng.choice([8, 16, 64])
        print(json.dumps(sc))


if __name__ == "__main__":
    main()

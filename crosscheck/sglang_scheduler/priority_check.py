"""Differential check of priority scheduling (docs/sglang-rules.md §13): admission with priority preemption
and retraction under --retraction-policy priority, kvadmit against SGLang 0.5.22's own code.

    python priority_check.py gen N SEED > snaps.jsonl                 # any Python (stdlib only)
    $VENV/bin/python priority_check.py sglang snaps.jsonl > sg.jsonl  # SGLang's answers (harness.py's build)
    python -m kvadmit capacity --scenario snaps.jsonl --json > kv.jsonl
    python priority_check.py compare snaps.jsonl kv.jsonl sg.jsonl    # exit 1 on any difference

run_priority.sh does the four steps. The SGLang side builds each snapshot with harness.py, gives every
request its priority (the snapshot's, else --default-priority-value, else the least urgent value), sets
queue-entry times in the order kvadmit's snapshot builder stamps them (waiting in order, then running),
sorts the queue with SchedulePolicy's own priority sort, and runs the admission loop of
Scheduler._get_new_batch_prefill_raw with preemption on: batch_is_full cleared, the request cap read
again for each candidate, PrefillAdder.preempt_to_schedule at the cap. Decode snapshots run
ScheduleBatch.retract_decode with get_schedule().retraction_policy set.
"""

from __future__ import annotations

import json
import random
import sys

ADMISSION_FIELDS = ["admitted", "chunked", "extend_lens", "prefix_lens", "verdict", "stopped_at", "preempted",
                    "rem_total_tokens", "cur_rem_tokens", "rem_input_tokens", "rem_chunk_tokens"]  # fmt: skip
DECODE_FIELDS = ["retract_called", "retracted", "aborted", "abort_message", "new_ratio", "kept",
                 "new_tokens_gained"]  # fmt: skip


# ----- generation (stdlib only) -----------------------------------------------------------------------
def _priority(rng: random.Random) -> int | None:
    return rng.choice([None, 0, 0, 1, 5, 9, 10, 11, 15, 20, 21, 30, -5])


def _admission_snapshot(rng: random.Random) -> dict:
    pool = rng.choice([600, 1000, 2000, 4000, 8000])
    n_run = rng.randint(1, 6)
    running, held = [], 0
    for j in range(n_run):
        prompt = rng.randint(1, pool // (4 * n_run) + 1)
        out = rng.randint(0, 40)
        max_new = out + rng.randint(0, 300)
        running.append({"rid": f"r{j}", "prompt_len": prompt, "output_len": out, "max_new_tokens": max_new,
                        "ignore_eos": rng.random() < 0.3, "priority": _priority(rng)})  # fmt: skip
        held += prompt + out
    evictable = rng.randint(0, max(0, (pool - held) // 3))
    waiting, claimed = [], 0
    for i in range(rng.randint(1, 5)):
        prompt = rng.randint(1, pool // 2)
        cached = rng.randint(0, prompt) if rng.random() < 0.3 else 0
        if claimed + cached > evictable:
            cached = 0
        claimed += cached
        waiting.append({"rid": f"w{i}", "prompt_len": prompt, "cached_prefix_len": cached,
                        "max_new_tokens": rng.randint(1, 400), "output_len": rng.choice([0, 0, 0, 3]),
                        "priority": _priority(rng)})  # fmt: skip
    server = {
        "max_total_tokens": pool,
        "max_running_requests": n_run + rng.choice([0, 0, 0, 1]),
        "chunked_prefill_size": rng.choice([None, 8192, 256]),
        "page_size": rng.choice([1, 1, 1, 16]),
        "enable_priority_scheduling": True,
        "schedule_low_priority_values_first": rng.random() < 0.5,
        "disable_priority_preemption": rng.random() < 0.1,
        "priority_scheduling_preemption_threshold": rng.choice([0, 5, 9, 10, 10, 11]),
    }
    if rng.random() < 0.3:
        server["default_priority_value"] = rng.choice([0, 10, 20])
    if server["page_size"] > 1:  # keep cached counts whole pages
        for w in waiting:
            w["cached_prefix_len"] = 0
        evictable = evictable // 16 * 16
    return {"server": server, "new_token_ratio": rng.choice([0.7, 0.5, 0.3333, 0.098]),
            "evictable_tokens": evictable, "running": running, "waiting": waiting}  # fmt: skip


def _decode_snapshot(rng: random.Random) -> dict:
    n = rng.randint(2, 7)
    running = [{"rid": f"r{j}", "prompt_len": rng.randint(1, 300), "output_len": rng.randint(0, 60),
                "max_new_tokens": 400, "priority": _priority(rng)} for j in range(n)]  # fmt: skip
    held = sum(r["prompt_len"] + r["output_len"] for r in running)
    server = {
        "max_total_tokens": held + rng.randint(0, n),
        "enable_priority_scheduling": True,
        "schedule_low_priority_values_first": rng.random() < 0.5,
        "retraction_policy": "priority",
    }
    return {"server": server, "check": "decode", "new_token_ratio": 0.3, "running": running}


def generate(n: int, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        snap = _decode_snapshot(rng) if rng.random() < 0.25 else _admission_snapshot(rng)
        print(json.dumps(snap))


# ----- SGLang's side (the SGLang venv) ------------------------------------------------------------------
def sglang_answers(path: str) -> None:
    import traceback

    import harness  # this folder: builds SGLang's objects (and installs the stubs)
    from sglang.srt import runtime_context as rc
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy

    def resolve(p: int | None, server: dict) -> int:
        if p is None:
            p = server.get("default_priority_value")
        if p is None:
            p = sys.maxsize if server.get("schedule_low_priority_values_first") else -sys.maxsize - 1
        return p

    def admission(snap: dict) -> dict:
        st = harness.build(snap)
        server, batch = snap["server"], st.batch
        low = bool(server.get("schedule_low_priority_values_first"))
        preempt = not server.get("disable_priority_preemption", False)
        for t, (req, spec) in enumerate(zip(st.waiting, snap["waiting"], strict=True), start=1):
            req.priority = resolve(spec.get("priority"), server)
            req.time_stats.wait_queue_entry_time = float(t)
        first_running = len(st.waiting) + 1
        for t, (req, spec) in enumerate(zip(st.running, snap["running"], strict=True), start=first_running):
            req.priority = resolve(spec.get("priority"), server)
            req.time_stats.wait_queue_entry_time = float(t)
        chunk = server.get("chunked_prefill_size")
        chunk = None if chunk is None or chunk <= 0 else chunk
        if preempt:
            batch.batch_is_full = False
        if batch.is_empty():
            batch.batch_is_full = False
        gate = None
        if batch.batch_is_full or not st.waiting:
            gate = "no_waiting"
        elif harness.num_allocatable(st, len(batch.reqs)) <= 0 and not preempt:
            batch.batch_is_full = True
            gate = "request_cap"
        SchedulePolicy._sort_by_priority_and_fcfs(st.waiting, 1 if low else -1)
        adder = PrefillAdder(
            st.P, st.cache, st.alloc, batch, st.ratio, server.get("max_prefill_tokens", 16384), chunk, 0,
            server.get("priority_scheduling_preemption_threshold", 10), max_prefill_bs=0,
            max_running_requests=st.mrr, prefill_max_requests=server.get("prefill_max_requests"),
            prefill_delayer_single_pass=None, dllm_config=None, waiting_queue_len=len(st.waiting),
            prefill_tile_block_m=64,
        )  # fmt: skip
        looked, last, stopped = [], None, None
        if gate is None:
            for req in st.waiting:
                if len(adder.can_run_list) >= harness.num_allocatable(st, len(batch.reqs)):
                    batch.batch_is_full = True
                if batch.batch_is_full and (not preempt or not adder.preempt_to_schedule(req)):
                    break
                req.init_next_round_input(st.cache)
                looked.append(req)
                res = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
                last = res
                if res != AddReqResult.CONTINUE:
                    if res == AddReqResult.NO_TOKEN:
                        batch.batch_is_full = len(adder.can_run_list) > 0 or not batch.is_empty()
                    stopped = req
                    break
        verdict = last if last is not None else adder.budget_state()
        out = {
            "admitted": [r.rid for r in adder.can_run_list],
            "chunked": adder.new_chunked_req.rid if adder.new_chunked_req is not None else None,
            "extend_lens": {r.rid: r.extend_end - r.prefix_len for r in adder.can_run_list},
            "prefix_lens": {r.rid: r.prefix_len for r in looked},
            "verdict": verdict.name,
            "stopped_at": stopped.rid if stopped is not None else None,
            # a list built from a set: compared as a set (docs/sglang-rules.md §13.4, step 6)
            "preempted": sorted(r.rid for r in adder.preempt_list),
        }
        out.update(harness.budget(adder))
        return out

    def decode(snap: dict) -> dict:
        server = snap["server"]
        low = bool(server.get("schedule_low_priority_values_first"))
        st = harness.build(snap)
        for req, spec in zip(st.running, snap["running"], strict=True):
            req.priority = resolve(spec.get("priority"), server)
        policy = server.get("retraction_policy", "length")
        with rc.get_schedule().override(schedule_low_priority_values_first=low, retraction_policy=policy):
            ok = st.batch.check_decode_mem()
            if ok:
                kept = [r.rid for r in st.batch.reqs]
                return {"retract_called": False, "retracted": [], "aborted": None, "abort_message": None,
                        "new_ratio": None, "kept": kept, "new_tokens_gained": 0}  # fmt: skip
            before = st.alloc.available_size()
            retracted, ratio, aborted = st.batch.retract_decode()
        last = aborted[-1] if aborted else None
        return {"retract_called": True, "retracted": [r.rid for r in retracted],
                "aborted": last.rid if last is not None else None,
                "abort_message": last.to_finish.message if last is not None else None, "new_ratio": ratio,
                "kept": [r.rid for r in st.batch.reqs],
                "new_tokens_gained": st.alloc.available_size() - before}  # fmt: skip

    with open(path) as f:
        for line in f:
            snap = json.loads(line)
            low = bool(snap["server"].get("schedule_low_priority_values_first"))
            try:
                with rc.get_schedule().override(schedule_low_priority_values_first=low):
                    ans = decode(snap) if snap.get("check") == "decode" else admission(snap)
            except Exception as e:  # report, keep going
                ans = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
            print(json.dumps(ans))


# ----- comparison ---------------------------------------------------------------------------------------
def compare(snaps_path: str, kv_path: str, sg_path: str) -> int:
    with open(snaps_path) as a, open(kv_path) as b, open(sg_path) as c:
        snaps = [json.loads(x) for x in a]
        kv = [json.loads(x) for x in b]
        sg = [json.loads(x) for x in c]
    assert len(snaps) == len(kv) == len(sg), (len(snaps), len(kv), len(sg))
    counts = {"admission": 0, "decode": 0, "preempting": 0, "mismatch": 0, "error": 0}
    for i, (snap, k, s) in enumerate(zip(snaps, kv, sg, strict=True)):
        if "error" in k or "error" in s:
            counts["error"] += 1
            if counts["error"] <= 3:
                print(f"snapshot {i}: error: kvadmit {k.get('error')} / sglang {s.get('error')}",
                      file=sys.stderr)  # fmt: skip
            continue
        decode_check = snap.get("check") == "decode"
        counts["decode" if decode_check else "admission"] += 1
        fields = DECODE_FIELDS if decode_check else ADMISSION_FIELDS
        if not decode_check:
            k = {**k, "preempted": sorted(k["preempted"])}
            counts["preempting"] += bool(s["preempted"])
        bad = [f for f in fields if k[f] != s[f] or type(k[f]) is not type(s[f])]
        if bad:
            counts["mismatch"] += 1
            if counts["mismatch"] <= 5:
                print(f"snapshot {i}: {bad}: kvadmit {[k[f] for f in bad]} / sglang {[s[f] for f in bad]}",
                      file=sys.stderr)  # fmt: skip
    print(
        f"compared: {counts['admission']} admission ({counts['preempting']} with a preemption), "
        f"{counts['decode']} decode; mismatches: {counts['mismatch']}; errors: {counts['error']}"
    )
    return 1 if counts["mismatch"] or counts["error"] else 0


def main() -> int:
    cmd, *rest = sys.argv[1:] or ["help"]
    if cmd == "gen" and len(rest) == 2:
        generate(int(rest[0]), int(rest[1]))
        return 0
    if cmd == "sglang" and len(rest) == 1:
        sglang_answers(rest[0])
        return 0
    if cmd == "compare" and len(rest) == 3:
        return compare(*rest)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())

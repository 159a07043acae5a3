"""Differential harness: run SGLang 0.5.22's own scheduler code on kvadmit snapshots (docs/architecture.md
"Snapshot format") and print SGLang's answers, one JSON line per snapshot, with kvadmit's field names.

Usage (with the SGLang venv that setup.sh makes; SGLang is imported, never copied):
    $VENV/bin/python harness.py SNAPSHOTS.jsonl > sglang_answers.jsonl
    $VENV/bin/python harness.py --self-check     # answers docs/architecture.md's example snapshot
    DIFF_PROBE=1 ... adds a "probe" list per admission answer (both sides of every fit test; stats.py
    counts the exact-boundary hits)

A snapshot that cannot be built or answered gives {"error": ..., "trace": ...} on its line.

Construction (what docs/architecture.md's snapshot means, built from SGLang's real classes):
* allocator: SGLang's TokenToKVPoolAllocator (token-granular free list, so the free count is exactly
  max_total_tokens - holdings - evictable) with its page_size attribute set to the snapshot's page
  size, so PrefillBudget / check_decode_mem / eviction use SGLang's page arithmetic;
* tree cache: SGLang's real UnifiedRadixCache (Rust tree core, FULL component) with page_size = the
  snapshot's; disable_radix_cache builds it with disable=True (what the 0.5.22 registry does) and
  the snapshot's evictable tokens are then held aside as allocated slots;
  the filler (evictable tokens not claimed by a waiting request) is inserted first (least recently
  used), then each waiting request's cached prefix (its own token ids: prompt + outputs);
* req-to-token pool: SGLang's ReqToTokenPool with one row per running request, reporting
  max_running_requests - used rows as available (the real pool has max_running_requests rows);
* running requests: SGLang Req objects holding prompt+output KV slots in a row, nothing in the tree;
* waiting requests: SGLang Req objects; output_len > 0 marks a retracted one (is_retracted,
  retracted_stain, as reset_for_retract leaves them);
* admission: PrefillAdder built with the arguments Scheduler._get_new_batch_prefill_raw passes, then
  the loop of _get_new_batch_prefill_raw (allocatable gate, per-request cap, init_next_round_input,
  add_one_req, stop at the first non-CONTINUE);
* decode: ScheduleBatch.check_decode_mem then retract_decode, new_tokens_gained measured as
  Scheduler.update_running_batch does.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import types
import warnings
from array import array

import stubs  # this script's folder is on sys.path

# SGLang imports a few packages that the venv does not have; stand-ins first, then SGLang.
stubs.install()
logging.disable(logging.CRITICAL)
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from sglang.srt import runtime_context as rc  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

# Some SGLang modules read the published server args at import time.
rc.publish(ServerArgs(model_path="dummy", device="cpu"), role="scheduler")

import sglang.srt.managers.schedule_policy as _schedule_policy  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402


class SnapshotAllocator(TokenToKVPoolAllocator):
    """SGLang's token allocator; page_size reports the server's page size."""

    def __init__(self, size: int, page_size: int):
        super().__init__(size, torch.int64, "cpu", None, False)
        self.page_size = page_size


class SnapshotReqToTokenPool(ReqToTokenPool):
    """Only the rows the running requests use are materialised; available_size() counts the rest of
    the max_running_requests rows as free, as the real pool would."""

    def __init__(self, logical_size: int, rows: int, max_context_len: int):
        super().__init__(max(rows, 1), max_context_len, "cpu", False)
        self.unmaterialised = logical_size - max(rows, 1)

    def available_size(self):
        return len(self.free_slots) + self.unmaterialised


def resolve_max_running_requests(requested, token_capacity, context_len):
    # KVCacheConfigurator.resolve_max_num_reqs for a plain model, attn_dp_size 1.
    estimated = int(token_capacity / context_len * 512)
    estimated = max(min(estimated, 4096), 2048)
    if requested is not None:
        return min(requested, token_capacity // 2)
    return min(estimated, token_capacity // 2)


def make_req(rid, base, prompt_len, output_len, max_new, ignore_eos):
    sp = SamplingParams(max_new_tokens=max_new, ignore_eos=ignore_eos)
    req = Req(rid, "", array("q", range(base, base + prompt_len)), sp)
    req.output_ids = array("q", range(base + prompt_len, base + prompt_len + output_len))
    return req


STRIDE = 1 << 40


def build(snap):
    server = snap["server"]
    P = server.get("page_size", 1) or 1
    pool = server["max_total_tokens"]
    radix = not server.get("disable_radix_cache", False)
    evictable = snap.get("evictable_tokens", 0) or 0
    running = snap.get("running", [])
    waiting = snap.get("waiting", [])
    context_len = server.get("context_length") or pool
    mrr = resolve_max_running_requests(server.get("max_running_requests"), pool, context_len)
    rc.get_parallel().override_permanently(pp_max_micro_batch_size=max(mrr // 1, 1))

    alloc = SnapshotAllocator(pool, P)
    longest = max([r["prompt_len"] + r.get("output_len", 0) for r in running] + [1])
    r2t = SnapshotReqToTokenPool(mrr, len(running), longest + 2 * P + 8)
    params = CacheInitParams(
        disable=not radix,
        req_to_token_pool=r2t,
        token_to_kv_pool_allocator=alloc,
        page_size=P,
        tree_components=(ComponentType.FULL,),
    )
    cache = UnifiedRadixCache(params)

    held_aside = None
    # With page_size > 1 SGLang's tree holds whole pages only. A snapshot whose cached counts are not
    # page multiples (no SGLang counterpart) keeps the page-aligned part in the tree and the partial
    # pages as an extra evictable count (admission only: nothing is evicted there).
    unaligned_extra = 0
    if radix:
        claimed = sum(w.get("cached_prefix_len", 0) for w in waiting)
        filler = evictable - claimed
        aligned = (filler // P) * P
        unaligned_extra += filler - aligned
        if aligned:
            key = array("q", range(-(aligned + 1), -1))
            cache.insert(
                InsertParams(key=RadixKey(token_ids=key, extra_key=None), value=alloc.alloc(aligned))
            )
    elif evictable:
        held_aside = alloc.alloc(evictable)

    wreqs = []
    for i, w in enumerate(waiting):
        base = (i + 1) * STRIDE
        out = w.get("output_len", 0) or 0
        req = make_req(
            str(w["rid"]), base, w["prompt_len"], out, w["max_new_tokens"], w.get("ignore_eos", False)
        )
        if out > 0:
            req.is_retracted = True
            req.retracted_stain = True
        n = w.get("cached_prefix_len", 0) or 0
        if radix and n:
            a = (n // P) * P
            unaligned_extra += n - a
            if a:
                key = (req.origin_input_ids + req.output_ids)[:a]
                res = cache.insert(
                    InsertParams(key=RadixKey(token_ids=key, extra_key=None), value=alloc.alloc(a))
                )
                assert res.prefix_len == 0
        wreqs.append(req)
    if unaligned_extra:
        if snap.get("check") == "decode":
            raise NotImplementedError("partial cached pages in a decode snapshot")
        held_aside = alloc.alloc(unaligned_extra)
        cache.evictable_size = lambda: UnifiedRadixCache.evictable_size(cache) + unaligned_extra

    rreqs = []
    for j, r in enumerate(running):
        base = (len(waiting) + j + 1) * STRIDE
        out = r.get("output_len", 0) or 0
        req = make_req(
            str(r["rid"]), base, r["prompt_len"], out, r["max_new_tokens"], r.get("ignore_eos", False)
        )
        n = r["prompt_len"] + out
        idx = alloc.alloc(n)
        assert idx is not None
        r2t.alloc([req])
        r2t.write((req.kv.req_pool_idx, slice(0, n)), idx.to(torch.int32))
        req.kv.kv_committed_len = n
        req.kv.kv_allocated_len = n
        req.kv.cache_protected_len = 0
        rreqs.append(req)

    assert (
        alloc.available_size()
        == pool - sum(r["prompt_len"] + r.get("output_len", 0) for r in running) - evictable
    ), "free count differs from the snapshot's"
    assert cache.evictable_size() == (evictable if radix else 0), (cache.evictable_size(), evictable)

    batch = ScheduleBatch(
        reqs=rreqs,
        req_to_token_pool=r2t,
        token_to_kv_pool_allocator=alloc,
        tree_cache=cache,
        model_config=types.SimpleNamespace(is_encoder_decoder=False, vocab_size=1 << 62),
        device="cpu",
        spec_algorithm=SpeculativeAlgorithm.NONE,
    )
    batch.req_pool_indices = torch.tensor([r.kv.req_pool_idx for r in rreqs], dtype=torch.int64)
    batch.req_pool_indices_cpu = batch.req_pool_indices.clone()
    lens = torch.tensor([r.kv.kv_committed_len for r in rreqs], dtype=torch.int64)
    batch.seq_lens = lens
    batch.orig_seq_lens = lens.clone()
    batch.seq_lens_cpu = lens.clone()
    # Sampling state (penalties, temperatures) plays no part in the decisions.
    batch.sampling_info = types.SimpleNamespace(filter_batch=lambda *a, **k: None)

    ratio = snap.get("new_token_ratio")
    if ratio is None:
        ratio = min(
            envs.SGLANG_INIT_NEW_TOKEN_RATIO.get() * server.get("schedule_conservativeness", 1.0), 1.0
        )

    return types.SimpleNamespace(
        P=P,
        pool=pool,
        mrr=mrr,
        alloc=alloc,
        r2t=r2t,
        cache=cache,
        batch=batch,
        waiting=wreqs,
        running=rreqs,
        ratio=float(ratio),
        held_aside=held_aside,
        server=server,
    )


def num_allocatable(st, running_bs):
    # Scheduler.get_num_allocatable_reqs: pp budget vs free request rows (no beams).
    pp_budget = rc.get_parallel().pp_max_micro_batch_size - running_bs
    return min(pp_budget, st.r2t.available_size())


def make_adder(st):
    server = st.server
    chunk = server.get("chunked_prefill_size")
    chunk = None if chunk is None or chunk <= 0 else chunk
    return PrefillAdder(
        st.P,
        st.cache,
        st.alloc,
        st.batch,
        st.ratio,
        server.get("max_prefill_tokens", 16384),
        chunk,
        0,  # mixed chunk off
        10,  # priority_scheduling_preemption_threshold default (unused: preemption off)
        max_prefill_bs=0,
        max_running_requests=st.mrr,
        prefill_max_requests=server.get("prefill_max_requests"),
        prefill_delayer_single_pass=None,
        dllm_config=None,
        waiting_queue_len=len(st.waiting),
        prefill_tile_block_m=64,
    )


PROBE = os.environ.get("DIFF_PROBE") == "1"
_probe_log = []
if PROBE:
    # Record the two sides of SGLang's fit tests (statistics only; the originals still decide).
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget

    _orig_check, _orig_can = PrefillBudget.check_prefill, PrefillBudget.can_allocate_prefill

    def _check(self, **kw):
        _probe_log.append(("fit", kw["total_tokens"], self.remaining_total))
        return _orig_check(self, **kw)

    def _can(self, **kw):
        _probe_log.append(("eos_fit", kw["paged_input"], min(self.remaining_current, self.remaining_total)))
        return _orig_can(self, **kw)

    PrefillBudget.check_prefill, PrefillBudget.can_allocate_prefill = _check, _can


def budget(adder):
    return {
        "rem_total_tokens": adder.rem_total_tokens,
        "cur_rem_tokens": adder.cur_rem_tokens,
        "rem_input_tokens": adder.rem_input_tokens,
        "rem_chunk_tokens": adder.rem_chunk_tokens,
    }


def admission(snap):
    st = build(snap)
    batch = st.batch
    running_bs = len(batch.reqs)
    looked, last, stopped = [], None, None
    gate = None
    if batch.is_empty():
        batch.batch_is_full = False
    if batch.batch_is_full or not st.waiting:
        gate = "no_waiting"
    elif num_allocatable(st, running_bs) <= 0:
        batch.batch_is_full = True
        gate = "request_cap"
    # fcfs: calc_priority leaves the queue as it is.
    adder = make_adder(st)
    if gate is None:
        for req in st.waiting:
            if len(adder.can_run_list) >= num_allocatable(st, len(batch.reqs)):
                batch.batch_is_full = True
            if batch.batch_is_full:
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
    }
    out.update(budget(adder))
    if PROBE:
        rs = adder.req_states
        if rs is not None and [x[0] for x in rs] != sorted(x[0] for x in rs):
            _probe_log.append(("eos_list_unsorted", 0, 0))
        if (
            rs is not None
            and verdict == AddReqResult.NO_TOKEN
            and stopped is not None
            and stopped not in adder.can_run_list
            and _probe_log
            and _probe_log[-1][0] == "eos_fit"
            and _probe_log[-1][1] <= _probe_log[-1][2]
        ):
            _probe_log.append(("eos_occupancy_reject", 0, 0))
        out["probe"] = list(_probe_log)
        _probe_log.clear()
    return out


def decode(snap):
    st = build(snap)
    batch = st.batch
    if batch.is_empty():
        return {
            "retract_called": False,
            "retracted": [],
            "aborted": None,
            "abort_message": None,
            "new_ratio": None,
            "kept": [],
            "new_tokens_gained": 0,
        }
    ok = batch.check_decode_mem()
    if ok:
        return {
            "retract_called": False,
            "retracted": [],
            "aborted": None,
            "abort_message": None,
            "new_ratio": None,
            "kept": [r.rid for r in batch.reqs],
            "new_tokens_gained": 0,
        }
    before = st.alloc.available_size()
    retracted, new_ratio, aborted = batch.retract_decode()
    gained = st.alloc.available_size() - before
    last = aborted[-1] if aborted else None
    return {
        "retract_called": True,
        "retracted": [r.rid for r in retracted],
        "aborted": last.rid if last is not None else None,
        "abort_message": last.to_finish.message if last is not None else None,
        "new_ratio": new_ratio,
        "kept": [r.rid for r in batch.reqs],
        "new_tokens_gained": gained,
    }


_DEFAULT_CLIP = _schedule_policy.CLIP_MAX_NEW_TOKENS


def answer(snap):
    if "snapshot" in snap and "server" not in snap:
        snap = snap["snapshot"]
    # server.env: SGLANG_* knobs. envs.X.get() reads os.environ on every call; the CLIP constant is
    # read once at import in SGLang, so it is set on the module as a fresh process would have it.
    env = {k: str(v) for k, v in (snap["server"].get("env") or {}).items()}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _schedule_policy.CLIP_MAX_NEW_TOKENS = int(
        env.get("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", _DEFAULT_CLIP)
    )
    try:
        return decode(snap) if snap.get("check", "admission") == "decode" else admission(snap)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _schedule_policy.CLIP_MAX_NEW_TOKENS = _DEFAULT_CLIP


# docs/architecture.md's example snapshot: setup.sh runs it to tell whether a venv works.
SELF_CHECK = {
    "server": {
        "max_total_tokens": 4096,
        "page_size": 1,
        "schedule_conservativeness": 1.0,
        "max_running_requests": None,
        "max_prefill_tokens": 16384,
        "chunked_prefill_size": 8192,
        "disable_radix_cache": False,
    },
    "new_token_ratio": 0.7,
    "evictable_tokens": 0,
    "running": [{"rid": "a", "prompt_len": 256, "output_len": 40, "max_new_tokens": 512, "ignore_eos": True}],
    "waiting": [
        {"rid": "b", "prompt_len": 256, "cached_prefix_len": 0, "max_new_tokens": 512, "ignore_eos": True}
    ],
}


def self_check():
    from importlib.metadata import version

    ans = answer(SELF_CHECK)
    assert ans["admitted"] == ["b"], ans
    print(f"sglang {version('sglang')} ok: {json.dumps(ans)}")


def main():
    if sys.argv[1:] == ["--self-check"]:
        self_check()
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                ans = answer(json.loads(line))
            except Exception as e:  # report, keep going
                ans = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
            print(json.dumps(ans))


if __name__ == "__main__":
    main()

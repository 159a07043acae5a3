"""Run loop scenarios through SGLang's REAL Scheduler.event_loop_normal / event_loop_overlap and record
what happened, one JSON line per scenario (record.py's format).

Usage (in the SGLang venv that ../sglang_scheduler/setup.sh makes; SGLang is imported, never copied):
    $VENV/bin/python sglang_side.py SCENARIOS.jsonl > sglang_records.jsonl

How the loop is driven (README.md):
* A Scheduler is made with object.__new__ (its __init__ starts a model, sockets and processes), then the
  attributes its loop touches are set: the real KV allocator, request-row pool and radix cache, and most
  of its components built by its own init_* methods (running status, chunked prefill, schedule policy,
  metrics reporter, pool stats, load inquirer, output streamer, batch result processor).
* ingest_requests is replaced: before the pass that follows the k-th launched batch it hands the
  scenario's requests that arrive then to SGLang's _add_request_to_queue (after init_req_max_new_tokens)
  and client aborts to SGLang's abort_request; it sets gracefully_exit when the script is done and the
  scheduler is fully idle.
* run_batch is replaced by a stub model: it counts the batch (forward_ct), and returns a result whose
  next token ids are computed when SGLang reads them (at result processing): EOS at the request's chosen
  output index, a fixed other token otherwise.
* Output to the tokenizer goes to a recorder; SGLang's log lines are caught by a logging handler.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import types
import warnings
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "sglang_scheduler"))
import stubs  # noqa: E402

EXTRA_STUBS = ["setproctitle", "einops", "uvicorn", "fastapi", "tvm_ffi"]

# scheduler.py imports a few more packages at module level than the admission modules do.
stubs.STUBBED.extend(EXTRA_STUBS)
stubs.install()
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from sglang.srt import runtime_context as rc  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

rc.publish(ServerArgs(model_path="dummy", device="cpu"), role="scheduler")

import record  # noqa: E402  (this folder)
from sglang.srt.managers import scheduler as sched_mod  # noqa: E402
from sglang.srt.managers.schedule_batch import ScheduleBatch  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

EOS = record.EOS_TOKEN
OTHER = record.OTHER_TOKEN


class _Null:
    """A component the loop calls but whose work plays no part in scheduling (metrics sinks, publishers,
    profilers, sleepers): every attribute is a no-op callable returning None, falsy."""

    def __getattr__(self, name):
        return _null_call

    def __bool__(self):
        return False


def _null_call(*a, **k):
    return None


class _Recorder:
    """Stands in for the ZMQ sender to the tokenizer: keeps what SGLang sends."""

    def __init__(self):
        self.sent = []

    def send_output(self, obj, req=None):
        self.sent.append(obj)

    def send_pyobj(self, obj):
        self.sent.append(obj)


class LogCatcher(logging.Handler):
    """SGLang's scheduling log lines (Prefill batch, Decode batch, retraction), into the run's events."""

    def __init__(self):
        super().__init__(level=logging.INFO)
        self.lines = []
        self.sink = None
        self.launched = lambda: 0

    def emit(self, rec):
        line = record.normalise_log_line(rec.getMessage())
        if self.sink is not None and record.is_scheduling_line(line):
            self.sink.append(["L", self.launched(), line])


catcher = LogCatcher()
for _name in (
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.scheduler_components.metrics_reporter",
    "sglang.srt.managers.schedule_batch",
):
    logging.getLogger(_name).addHandler(catcher)
    logging.getLogger(_name).setLevel(logging.INFO)
    logging.getLogger(_name).propagate = False


class LazyTokens:
    """next_token_ids: read by SGLang when it processes the result; by then each request's output_ids
    holds exactly the tokens before this one, so len(output_ids) is this token's output index."""

    def __init__(self, reqs, eos_at):
        self.reqs = list(reqs)
        self.eos_at = eos_at

    def tolist(self):
        return [EOS if self.eos_at.get(r.rid) == len(r.output_ids) else OTHER for r in self.reqs]

    def __iter__(self):
        return iter(self.tolist())

    def __len__(self):
        return len(self.reqs)


def make_server_args(server: dict) -> ServerArgs:
    chunk = server.get("chunked_prefill_size")
    return ServerArgs(
        model_path="dummy",
        device="cpu",
        page_size=server["page_size"],
        max_total_tokens=server["max_total_tokens"],
        chunked_prefill_size=chunk if chunk is not None else -1,
        max_prefill_tokens=server["max_prefill_tokens"],
        max_running_requests=server.get("max_running_requests"),
        schedule_conservativeness=server["schedule_conservativeness"],
        disable_radix_cache=server["disable_radix_cache"],
        schedule_policy=server["schedule_policy"],
        decode_log_interval=server["decode_log_interval"],
        disable_overlap_schedule=not server["overlap"],
        context_length=server.get("context_length"),
        grammar_backend="none",
        enable_priority_scheduling=server.get("enable_priority_scheduling", False),
        enable_mixed_chunk=server.get("enable_mixed_chunk", False),
    )


class StubDPAttn:
    """SchedulerDPAttnAdapter with attention DP off: every batch passes through unchanged."""

    def maybe_prepare_mlp_sync_batch(self, batch, need_sync=True):
        return batch

    def maybe_convert_decode_to_extend(self, batch):
        return batch

    def drop_sync_wait_carry(self):
        return None


class StubNgram:
    def prepare_for_forward(self, batch, chunked_req=None):
        return batch


class StubGrammar:
    """No constrained decoding in these scenarios: no request goes to the grammar queue."""

    grammar_queue: tuple = ()

    def has_waiting_grammars(self):
        return False

    def process_req_with_grammar(self, req):
        return False

    def abort_requests(self, recv_req):
        return None


class StubDllm:
    def any_staging_reqs(self):
        return False


def resolve_max_running_requests(requested, token_capacity, context_len):
    # KVCacheConfigurator.resolve_max_num_reqs for a plain model, attention DP 1 (as harness.py).
    estimated = int(token_capacity / context_len * 512)
    estimated = max(min(estimated, 4096), 2048)
    if requested is not None:
        return min(requested, token_capacity // 2)
    return min(estimated, token_capacity // 2)


def build_scheduler(server: dict):
    """A Scheduler without its __init__: the state its event loops read, SGLang's own pools, cache and
    components, and stubs only where a component drives hardware or other processes."""
    args = make_server_args(server)
    rc.publish(args, role="scheduler")
    P = server["page_size"]
    pool = server["max_total_tokens"]
    context_len = server["context_length"]
    mrr = resolve_max_running_requests(server.get("max_running_requests"), pool, context_len)
    # One rank of everything (tp, pp, attention tp/cp/dp all of size 1).
    rc.get_parallel().override_permanently(
        pp_max_micro_batch_size=max(mrr, 1),
        attn_tp_rank=0,
        attn_cp_rank=0,
        attn_dp_rank=0,
        pp_rank=0,
        tp_rank=0,
        dp_rank=None,
        moe_ep_rank=0,
        attn_dcp_rank=0,
    )
    max_req_len = min(context_len - 1, pool - 1)  # TpModelWorker.get_worker_info

    s = object.__new__(Scheduler)
    s.server_args = args
    s.forward_ct = 0
    s.processed_tokens_counter = 0
    s.cur_batch_for_debug = None
    g = rc.get_schedule()
    s.schedule_policy = g.schedule_policy
    s.enable_priority_scheduling = g.enable_priority_scheduling
    s.abort_on_priority_when_disabled = g.abort_on_priority_when_disabled
    s.schedule_low_priority_values_first = g.schedule_low_priority_values_first
    s.priority_scheduling_preemption_threshold = g.priority_scheduling_preemption_threshold
    s.enable_lora = False
    s.enable_lora_overlap_loading = False
    s.enable_overlap = not g.disable_overlap_schedule
    s.enable_overlap_mlx = False
    s.enable_pdmux = False
    s.skip_tokenizer_init = True
    s.stream_interval = 1
    s.spec_algorithm = SpeculativeAlgorithm.NONE
    s.page_size = P
    s.enable_hierarchical_cache = False
    s.enable_lmcache = False
    s.enable_session_radix_cache = False
    s.enable_hicache_storage = False
    s.enable_unified_cache_external_linker = False
    s.enable_decode_hicache = False
    s.max_new_tokens_limit = None
    s.enable_hisparse = False
    s.attn_dp_enabled = False
    s.enable_unified_memory = False
    s.enable_fpm = False
    s.dllm_config = None
    s.dllm_manager = StubDllm()
    s.require_mlp_sync = False
    s.is_generation = True
    s.disaggregation_mode = sched_mod.DisaggregationMode.NULL
    s.model_config = types.SimpleNamespace(
        is_encoder_decoder=False,
        vocab_size=1 << 20,
        hf_eos_token_id={EOS},
        context_len=context_len,
        is_multimodal=False,
        num_key_value_heads=1,
        hf_config=types.SimpleNamespace(architectures=["LlamaForCausalLM"]),
        use_ngram_embedding=False,
        think_end_ids=None,
        self_opened_think_start_ids=None,
    )
    s.device = "cpu"
    s.max_total_num_tokens = pool
    s.max_prefill_tokens = server["max_prefill_tokens"]
    s.max_running_requests = mrr
    s.max_queued_requests = None
    s.max_req_len = max_req_len
    s.max_req_input_len = max_req_len - 5
    s.min_free_slots_delayer = None
    s.truncation_align_size = None
    s.decode_offload_manager = None
    s.hisparse_coordinator = None
    s.draft_worker = None
    s.is_hybrid_swa = False
    s.is_hybrid_ssm = False
    s.sliding_window_size = None
    s.full_tokens_per_layer = pool
    s.swa_tokens_per_layer = None
    s.kv_shard_widening = 1
    s.mm_receiver = None
    s.tokenizer = None
    s.scripted_scheduler_hook = None
    s.return_health_check_ipcs = None

    # SGLang's own KV pools and radix cache (as harness.py builds them, empty).
    alloc = TokenToKVPoolAllocator(pool, torch.int64, "cpu", None, False)
    alloc.page_size = P
    if P > 1:
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

        alloc = PagedTokenToKVPoolAllocator(pool, P, torch.int64, "cpu", None, False)
    r2t = ReqToTokenPool(mrr, context_len + 8, "cpu", False)
    params = CacheInitParams(
        disable=server["disable_radix_cache"],
        req_to_token_pool=r2t,
        token_to_kv_pool_allocator=alloc,
        page_size=P,
        tree_components=(ComponentType.FULL,),
    )
    s.req_to_token_pool = r2t
    s.token_to_kv_pool_allocator = alloc
    s.tree_cache = UnifiedRadixCache(params)
    s.disable_radix_cache = server["disable_radix_cache"]

    s.init_kv_event_lora_names()
    s.ipc_channels = types.SimpleNamespace(
        send_to_tokenizer=_Recorder(),
        send_to_detokenizer=_Recorder(),
        send_metrics_from_scheduler=None,
        recv_from_rpc=None,
    )
    s.init_metrics_collector()
    s.init_running_status()
    # init_chunked_prefill asks the model loader which implementation serves the model (only to turn
    # chunking off for multimodal Transformers-backend models): a plain model here.
    sched_mod.get_resolved_model_impl = lambda model_config: None
    s.init_chunked_prefill()
    s.dynamic_chunk_sizer = None
    s.tp_worker = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(attn_backend=None, prefill_aware_swa=False),
        model_config=s.model_config,
    )
    s.model_worker = s.tp_worker
    s.forward_stream = torch.cpu.Stream()
    s.schedule_stream = torch.cpu.Stream()
    s.init_metrics_reporter()
    s.scheduler_stage_metrics = s.metrics_reporter.scheduler_stage_metrics
    s.init_schedule_policy()
    s.profiler_manager = _Null()  # the torch profiler; needs the process groups
    s.rust_server = None
    s.init_overlap()
    s.ngram_embedding_manager = StubNgram()
    s.use_ngram_embedding = False
    s.lora_drainer = None
    s.grammar_manager = StubGrammar()
    s.dp_attn_adapter = StubDPAttn()
    s.init_pool_stats_observer()
    s.init_invariant_checker()
    s.kv_events_publisher = _Null()
    s.load_publisher = _Null()
    s.load_snapshot_writer = None
    s.disagg_prefill_bootstrap_queue = None
    s.disagg_prefill_inflight_queue = None
    s.disagg_decode_prealloc_queue = None
    s.disagg_decode_transfer_queue = None
    s.init_load_inquirer()
    s.init_output_streamer()
    s.init_batch_result_processor()
    s.idle_sleeper = None
    s._war_barrier_enabled = False  # a CUDA stream fence between forward and result processing
    return s


_real_retract_decode = ScheduleBatch.retract_decode
_current_driver = []


def _recording_retract_decode(self, *a, **k):
    """SGLang's retract_decode, with its outcome recorded: the retracted rids, the ratio before and after,
    the slots it freed (measured as update_running_batch measures #new_tokens_gained) and the aborted."""
    d = _current_driver[-1]
    alloc = d.s.token_to_kv_pool_allocator
    before, old = alloc.available_size(), d.s.new_token_ratio_tracker.current
    retracted, new_ratio, aborted = _real_retract_decode(self, *a, **k)
    d.events.append(
        ["R", d.launched, [r.rid for r in retracted], alloc.available_size() - before, old, new_ratio]
    )
    for r in aborted:
        d.events.append(["A", d.launched, r.rid])
    return retracted, new_ratio, aborted


ScheduleBatch.retract_decode = _recording_retract_decode


def finish_kind(req) -> str:
    name = type(req.finished_reason).__name__
    return {"FINISH_LENGTH": "length", "FINISH_MATCHED_TOKEN": "stop", "FINISH_ABORT": "abort"}.get(
        name, name
    )


class Driver:
    """Runs one scenario through the real loop and keeps its record (a list of events in order)."""

    STALL_PASSES = 2000  # passes in a row that launch nothing while work is left: a stuck run

    def __init__(self, scenario: dict):
        self.sc = scenario
        self.s = build_scheduler(scenario["server"])
        self.events: list = []
        self.launched = 0
        self.requests = sorted(scenario["requests"], key=lambda r: r["arrive_after"])
        self.next_arrival = 0
        self.aborts = sorted(
            [(r["abort_after"], r["rid"]) for r in scenario["requests"] if r.get("abort_after") is not None]
        )
        self.next_abort = 0
        self.eos_at = {r["rid"]: r.get("eos_at") for r in scenario["requests"]}
        self.reqs: dict = {}
        self.ended: set = set()
        self.idle_seen = False
        self.quiet_passes = 0
        self._patch()

    # ----- the patched scheduler methods ----------------------------------------------------------
    def _patch(self):
        s = self.s
        s.ingest_requests = self.ingest
        s.run_batch = self.run_batch
        real_process = s.process_batch_result
        real_update = s.update_running_batch
        real_on_idle = s.on_idle

        def process_batch_result(batch, result):
            real_process(batch, result)
            self.scan_finished()

        def update_running_batch(batch):
            out = real_update(batch)
            if out is None:
                self.events.append(["S", self.launched])
            return out

        def on_idle():
            real_on_idle()
            if s.is_fully_idle():
                self.idle_seen = True

        s.process_batch_result = process_batch_result
        s.update_running_batch = update_running_batch
        s.on_idle = on_idle

    def ingest(self, stop_at_pause=False):
        s = self.s
        due = self.next_arrival < len(self.requests) and (
            self.requests[self.next_arrival]["arrive_after"] <= self.launched
        )
        if not due and self.idle_seen and self.next_arrival < len(self.requests):
            # Nothing will launch until the next request comes: it comes now.
            self.launched_floor = self.requests[self.next_arrival]["arrive_after"]
            due = True
        if due:
            key = self.requests[self.next_arrival]["arrive_after"]
            while self.next_arrival < len(self.requests) and self.requests[self.next_arrival][
                "arrive_after"
            ] <= max(key, self.launched):
                self.add(self.requests[self.next_arrival])
                self.next_arrival += 1
            self.idle_seen = False
            self.quiet_passes = 0  # a hang is judged on the passes after the last arrival
        while self.next_abort < len(self.aborts) and self.aborts[self.next_abort][0] <= self.launched:
            self.client_abort(self.aborts[self.next_abort][1])
            self.next_abort += 1
        self.scan_finished()
        if self.next_arrival >= len(self.requests) and self.idle_seen:
            s.gracefully_exit = True
        self.quiet_passes += 1
        if self.quiet_passes >= 3 and self.stuck():
            # SGLang waits forever here (the head of the queue does not fit even in an empty pool, e.g. an
            # ignore_eos request with the radix cache off whose max_new_tokens is at the memory cap);
            # kvadmit ends that request instead. Record the hang and end it by a client abort.
            head = s.waiting_queue[0]
            self.events.append(["H", self.launched, head.rid])
            self.client_abort(head.rid, record_it=False)
            self.scan_finished()
            self.quiet_passes = 0
        if self.quiet_passes > self.STALL_PASSES:
            raise RuntimeError(f"stalled: {self.quiet_passes} passes launched nothing")
        return []

    def add(self, spec):
        s = self.s
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput

        sp = SamplingParams(max_new_tokens=spec["max_new_tokens"], ignore_eos=spec["ignore_eos"])
        sp.normalize(None)
        recv = TokenizedGenerateReqInput(
            rid=spec["rid"],
            input_text="",
            input_ids=array("q", spec["input_ids"]),
            input_embeds=None,
            mm_inputs=None,
            token_type_ids=None,
            sampling_params=sp,
            return_logprob=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            stream=False,
            priority=spec.get("priority"),
        )
        before = {id(r) for r in s.waiting_queue}
        s.handle_generate_request(recv)
        for r in s.waiting_queue:
            if id(r) not in before:
                self.reqs[r.rid] = r
        self.events.append(["I", self.launched, spec["rid"]])

    def client_abort(self, rid, record_it=True):
        from sglang.srt.managers.io_struct import AbortReq

        self.s.abort_request(AbortReq(rid=rid))
        if record_it:
            self.events.append(["C", self.launched, rid])

    def stuck(self):
        """Nothing runs, nothing is in flight, and the queue's head waits: no later pass changes that."""
        s = self.s
        return (
            s.running_batch.is_empty()
            and s.chunked_req is None
            and (s.last_batch is None)
            and not s.result_queue
            and bool(s.waiting_queue)
        )

    def run_batch(self, batch, pp_proxy_tensors=None):
        s = self.s
        self.scan_finished()  # ends decided in this pass (a chunked request's client abort) come first
        s.forward_ct += 1
        batch.forward_iter = s.forward_ct
        batch.launch_ts = time.monotonic()
        s._sched_idled = False
        self.launched += 1
        self.quiet_passes = 0
        if batch.forward_mode.is_extend():
            rows = [[r.rid, int(n)] for r, n in zip(batch.reqs, batch.extend_lens, strict=True)]
            kind = "prefill"
        else:
            rows = [[r.rid, 1] for r in batch.reqs]
            kind = "decode"
        self.events.append(["B", self.launched, kind, rows, s.new_token_ratio_tracker.current])
        return GenerationBatchResult(next_token_ids=LazyTokens(batch.reqs, self.eos_at), copy_done=None)

    def scan_finished(self):
        for rid, r in self.reqs.items():
            if rid not in self.ended and r.finished():
                self.ended.add(rid)
                self.events.append(["F", self.launched, rid, finish_kind(r)])
        for obj in self.s.ipc_channels.send_to_tokenizer.sent:
            rid = getattr(obj, "rid", None)
            if rid is not None and rid not in self.ended:
                self.ended.add(rid)
                self.events.append(["F", self.launched, rid, "abort"])
        self.s.ipc_channels.send_to_tokenizer.sent.clear()

    def run(self):
        s = self.s
        loop = s.event_loop_overlap if s.enable_overlap else s.event_loop_normal
        loop()
        return self.events


def run_scenario(sc: dict) -> dict:
    # SGLANG_* knobs: SGLang reads them from the environment (the ratio tracker when it is built, the
    # retraction estimate at each retraction), so they are set for the whole run.
    env = {k: str(v) for k, v in (sc["server"].get("env") or {}).items()}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _run_scenario(sc)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_scenario(sc: dict) -> dict:
    catcher.lines = []
    d = Driver(sc)
    catcher.sink = d.events
    _current_driver.append(d)
    catcher.launched = lambda: d.launched
    try:
        d.run()
    except RuntimeError as e:  # SGLang's allocators raise this and its scheduler process dies
        if "out of memory" not in str(e).lower():
            raise
        d.events.append(["X", d.launched, str(e).strip()])
    finally:
        catcher.sink = None
        _current_driver.pop()
    return {"id": sc["id"], "events": d.events}


SELF_CHECK = {
    "id": "self-check",
    "server": {
        "max_total_tokens": 256,
        "page_size": 1,
        "chunked_prefill_size": 64,
        "max_prefill_tokens": 16384,
        "max_running_requests": None,
        "schedule_conservativeness": 1.0,
        "disable_radix_cache": False,
        "schedule_policy": "fcfs",
        "decode_log_interval": 1,
        "context_length": 4096,
        "overlap": False,
    },
    "requests": [
        {
            "rid": "a",
            "input_ids": [100, 101, 102],
            "max_new_tokens": 3,
            "ignore_eos": False,
            "eos_at": None,
            "arrive_after": 0,
        },
    ],
}


def self_check():
    """Both loops on a one-request script: a prefill then two decodes, ended by length."""
    from importlib.metadata import version

    for overlap in (False, True):
        sc = json.loads(json.dumps(SELF_CHECK))
        sc["server"]["overlap"] = overlap
        kinds = [e[2] for e in run_scenario(sc)["events"] if e[0] == "B"]
        assert kinds == ["prefill", "decode", "decode"], (overlap, kinds)
    print(f"sglang {version('sglang')}: both event loops run")


def main():
    if sys.argv[1:] == ["--self-check"]:
        self_check()
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    # The records go to stdout alone: whatever else writes to file descriptor 1 (SGLang prints its radix
    # tree there before an out-of-memory error) goes to stderr.
    records = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    record.run_each(sys.argv[1], run_scenario, out=records)


if __name__ == "__main__":
    main()

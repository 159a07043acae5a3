"""The scheduler: one pass picks the next batch; the executor runs it; the result updates requests.

This is the thin orchestrator over admission, ratio, retraction and ordering. It reproduces SGLang's
scheduling pass (docs/sglang-rules.md §1–§3) for both of its event loops:

    next_batch():   checkpoint the chunked request; merge the last prefill batch into the running batch;
                    try to form a prefill batch (admission) — prefill has priority;
                    else check decode memory (retracting if needed), decay or reset the ratio,
                    and give the running batch one more slot each;
                    nothing to do: if fully idle, reset the ratio.
    on_batch_done(): append the sampled tokens, finish requests, hand KV to the prefix cache.

The loop is the caller's (engine.py): the non-overlap loop processes each batch's result before the next
pass; the overlap loop (SGLang's default, docs/sglang-rules.md A.1) runs the next pass while the last
batch is still `in_flight`. The pass itself only asks whether a batch is in flight: its requests' outputs
then lag one token, those about to finish still hold their KV and reservation, and a decode pass may skip.

Three mixins hold the rest of its methods, each over the state kept here: intake.py (add_request: the
output budget granted, rejections; abort_request), decode_memory.py (the decode memory check and
retraction) and results.py (on_batch_done).

It never reads a clock and never imports torch; the same inputs give the same decisions.
"""

from __future__ import annotations

from collections.abc import Callable

from kvadmit.config import ConfigError, ServerArgs, resolve_chunked_prefill_size, resolve_max_running_requests
from kvadmit.memory.pool import ReqSlotPool, TokenPool
from kvadmit.memory.radix import NoPrefixCache, RadixCache
from kvadmit.request import Req
from kvadmit.scheduler.admission import AddResult, AdmissionPass, prepare_candidate
from kvadmit.scheduler.batch import RunningBatch
from kvadmit.scheduler.decode_memory import DECODE_SKIPPED, DecodeMemory
from kvadmit.scheduler.errors import EngineCrash, out_of_memory_message
from kvadmit.scheduler.events import Event
from kvadmit.scheduler.intake import RequestIntake
from kvadmit.scheduler.invariants import check_invariants
from kvadmit.scheduler.mixed_chunk import MixedChunk
from kvadmit.scheduler.ordering import QueueOrder
from kvadmit.scheduler.output_budget import max_request_len
from kvadmit.scheduler.policy import admission_policy
from kvadmit.scheduler.preemption import PriorityPreemption
from kvadmit.scheduler.priority import PriorityScheduling
from kvadmit.scheduler.ratio import NewTokenRatio
from kvadmit.scheduler.results import StepResults
from kvadmit.scheduler.retraction import RetractResult, evict_for
from kvadmit.scheduler.types import (
    UNSCHEDULABLE_MESSAGE,
    AdmissionRecord,
    ScheduledBatch,
    StepOutcome,
)

__all__ = ["AdmissionRecord", "EngineCrash", "ScheduledBatch", "Scheduler", "StepOutcome"]


class Scheduler(RequestIntake, DecodeMemory, StepResults, PriorityPreemption, MixedChunk):
    def __init__(
        self,
        args: ServerArgs,
        *,
        max_total_tokens: int | None = None,
        context_len: int | None = None,
        eos_token_ids: frozenset[int] = frozenset(),
        token_pool: TokenPool | None = None,
        stop_checker: Callable[[Req], str | None] | None = None,
    ) -> None:
        """`stop_checker(req)` is asked after each new token whether a stop string now ends the
        request's text (the tokenizer lives above the scheduler); it returns the string or None.
        `token_pool` replaces the default pool of max_total_tokens slots in pages of --page-size (the
        snapshot builder passes one with single-token pages, to hold arbitrary token counts)."""
        pool_size = max_total_tokens if max_total_tokens is not None else args.max_total_tokens
        if token_pool is None and (pool_size is None or pool_size <= 0):
            raise ConfigError("the KV pool needs a positive size (--max-total-tokens)")
        self.args = args
        self.profile = args.profile
        self.prio = PriorityScheduling.from_args(args)
        self.policy = admission_policy(args.admission_policy, self.prio)
        self.knobs = self.policy.knobs(args.knobs)
        self.page_size = args.page_size
        self.pool = token_pool if token_pool is not None else TokenPool(pool_size or 0, args.page_size)
        pool_size = self.pool.size
        self.max_total_num_tokens = self.pool.size
        if self.max_total_num_tokens < 2 * self.page_size:
            raise ConfigError(
                f"a pool of {pool_size} tokens holds fewer than two pages of {self.page_size}; "
                "raise --max-total-tokens or lower --page-size"
            )
        self.context_len = context_len or args.context_length or self.max_total_num_tokens
        self.chunked_prefill_size = resolve_chunked_prefill_size(args.chunked_prefill_size)
        self.mixed_chunk = args.enable_mixed_chunk and self.chunked_prefill_size is not None
        self.max_running_requests = resolve_max_running_requests(
            args.max_running_requests, self.max_total_num_tokens, self.context_len
        )
        self.max_req_len = max_request_len(self.context_len, self.max_total_num_tokens)
        self.eos_token_ids = eos_token_ids
        self.decode_log_interval = args.decode_log_interval
        self.stop_checker = stop_checker

        cache_cls = NoPrefixCache if args.disable_radix_cache else RadixCache
        self.cache: RadixCache = cache_cls(self.pool, args.page_size)
        self.req_slots = ReqSlotPool(self.max_running_requests)
        self.ratio = NewTokenRatio.from_config(args.schedule_conservativeness, self.knobs)
        self.order = QueueOrder(args.schedule_policy, self.cache, args.random_seed, self.prio)

        self.waiting: list[Req] = []
        self._defer_slots = False  # decode slots kept owed until read (defer_decode_slots)
        self.running = self._new_running_batch()
        self.chunked_req: Req | None = None
        self.last_batch: ScheduledBatch | None = None
        # The last batch handed out whose result is not processed yet (under the overlap loop, while the
        # next pass runs); None once on_batch_done has taken it.
        self.in_flight: ScheduledBatch | None = None
        self._stash_chunk = False  # the chunked request computed a chunk since it was last checkpointed
        self._finish_count = 0  # requests ended by a result (a stamp: did any end while a batch was out)
        self._finish_log: list[Req] = []  # the requests ended since count _finish_log_base, in order
        self._finish_log_base = 0
        self._left_in_pass: list[Req] = []  # retracted or aborted by the latest pass
        self.forward_ct = 0  # batches launched (prefill and decode)
        self.forward_ct_decode = 0  # decode batches processed (mod 2^30), for the decode log interval
        self._generated_since_log = 0
        self._seq = 0
        self.events: list[Event] = []
        self.last_retract_result: RetractResult | None = None
        self._finished_positions: list[int] = []  # running-batch positions of requests that ended
        # Requests of the batch in flight that its result will finish by length, taken out of the running
        # batch by the last decode pass (overlap loop only).
        self._dropped_finishing: list[Req] = []
        self._waiting_tokens = 0  # Σ seqlen over the waiting queue (for #pending-token)
        self._stop_token_union: frozenset[int] = frozenset()  # every stop token id of any request
        self._abort_rids: set[str] = set()  # live requests the client aborted

    def _new_running_batch(self, reqs: list[Req] | None = None) -> RunningBatch:
        return RunningBatch(
            self.knobs.clip_max_new_tokens_estimation, self.profile.ignore_eos_reserves_in_full, reqs,
            self._defer_slots,
        )  # fmt: skip

    # ===== one scheduling pass ==================================================================
    def next_batch(self) -> ScheduledBatch | None:
        """The next batch to run, or None when nothing can run until a new request arrives.

        SGLang's loop spins: a pass that forms nothing (say, the decode pass that drops the last finished
        requests) is followed at once by another, which may admit the waiting queue. We run that next
        pass here rather than return None while work is waiting.
        """
        batch = self._one_pass()
        if batch is None and self.in_flight is not None:
            return None  # the overlap loop processes the batch in flight before its next pass
        if batch is None and (
            (self.waiting and not self.running.batch_is_full) or self.chunked_req is not None
        ):
            batch = self._one_pass()
        while batch is None and self.waiting and not self.running.reqs and self.chunked_req is None:
            # The pool is as empty as it will ever be and the head of the queue still does not fit.
            # SGLang would wait forever here (e.g. an ignore_eos request with --disable-radix-cache whose
            # max_new_tokens is at the memory cap fails the future-occupancy check); we end it instead.
            head = self.waiting.pop(0)
            self._waiting_tokens -= head.seqlen
            self._reject(head, UNSCHEDULABLE_MESSAGE, 400)
            self.running.batch_is_full = False
            batch = self._one_pass()
        # Keep the finish log back to the oldest batch whose result is still to come.
        oldest = self.in_flight.finish_stamp if self.in_flight is not None else self._finish_count
        if oldest > self._finish_log_base:
            del self._finish_log[: oldest - self._finish_log_base]
            self._finish_log_base = oldest
        if batch is not None:
            batch.finish_stamp = self._finish_count
        self.in_flight = batch
        return batch

    def _one_pass(self) -> ScheduledBatch | None:
        self._dropped_finishing = []
        self._left_in_pass = []
        self._stash_chunked_req()
        self._merge_last_prefill()
        if self.profile.filter_finished_every_pass and self._drop_finished():
            self.running.batch_is_full = False  # a batch that lost any is no longer full
        batch = self._get_new_prefill_batch()
        if batch is None and self.running.reqs:
            batch = self._update_running_batch()
        if batch is None:
            if self.in_flight is None:  # SGLang's overlap loop runs on_idle only with no last batch
                self._on_idle()
        else:
            self.forward_ct += 1
        self.last_batch = batch
        return batch

    def _drop_finished(self) -> bool:
        """Take the requests that ended out of the running batch (SGLang's filter_batch: 0.5.22 before a
        decode step or a mixed chunk, 0.5.23 every pass). Whether any left; the callers say what that
        does to batch_is_full."""
        if not self._finished_positions:
            return False
        self.running.drop_at(sorted(set(self._finished_positions)))
        self._finished_positions = []
        return True

    def _merge_last_prefill(self) -> None:
        last = self.last_batch
        if last is None or last.kind != "prefill":
            return
        keep = [r for r in last.reqs if not r.finished and r is not last.chunked]
        if len(keep) < len(last.reqs):
            self.running.batch_is_full = False
        if not keep:
            return
        if not self.running.reqs:
            self.running = self._new_running_batch(keep)  # SGLang replaces the empty batch object
        else:
            self.running.extend(keep)

    def _num_allocatable_reqs(self, running_bs: int, held_rows: int = 0) -> int:
        """SGLang's get_num_allocatable_reqs; `held_rows` (0.5.23): request rows that requests of this
        pass already hold (the continuing chunk), credited to the free rows."""
        return min(self.max_running_requests - running_bs, self.req_slots.available_size() + held_rows)

    def run_admission(self, explain: bool = False) -> AdmissionRecord:
        """SGLang's `_get_new_batch_prefill_raw` up to the point where the batch is known: the gates,
        the in-flight chunk, then the waiting queue in policy order until a verdict other than CONTINUE
        or the request cap. Nothing is allocated yet."""
        record = AdmissionRecord(running_bs=len(self.running.reqs))
        if self.prio.preemption:
            self.running.batch_is_full = False  # SGLang: so that a pass may try preemption
        if self.chunked_req is None:
            if self.running.batch_is_full:
                record.gate = "batch_is_full"
                return record
            if not self.waiting:
                record.gate = "no_waiting"
                return record
        record.allocatable = self._num_allocatable_reqs(record.running_bs)
        if record.allocatable <= 0 and self.chunked_req is None and not self.prio.preemption:
            self.running.batch_is_full = True
            record.gate = "request_cap"
            return record
        self.order.sort(self.waiting)
        if self.knobs.test_retract and record.running_bs > self.knobs.test_retract_no_prefill_bs:
            record.gate = "test_retract_no_prefill"
            return record

        adder = record.adder = self._new_admission_pass()
        chunked = self.chunked_req
        if chunked is not None:
            prepare_candidate(chunked, self.cache, continuing_chunk=True)
            self.chunked_req = adder.add_chunked_req(chunked)
        profile = self.profile
        # 0.5.23 counts the request row the continuing chunk already holds (docs/sglang-rules.md A.2), on
        # every candidate's check, the one after a preemption included
        held = int(chunked is not None and profile.credit_held_rows)
        cap = self._num_allocatable_reqs(record.running_bs, held)
        at_cap = False  # with preemption, once the cap is reached every later candidate must preempt
        for req in self.waiting:
            if profile.stop_admission_when_budget_spent and adder.budget_state() is AddResult.OTHER:
                record.stop_cause = "budget_spent"  # 0.5.23: a resumed chunk spent the pass budget
                break
            if self.prio.preemption:  # preemption frees request slots: the cap is read again each time
                allocatable = self._num_allocatable_reqs(len(self.running.reqs), held)
                at_cap = at_cap or len(adder.can_run_list) >= allocatable
            else:
                at_cap = len(adder.can_run_list) >= cap
            if at_cap:
                self.running.batch_is_full = True
                if not (self.prio.preemption and self.preempt_for(req, adder, record.preempted)):
                    record.stop_cause = "request_cap"
                    break
            prepare_candidate(req, self.cache)
            record.looked_at.append(req)
            if explain:
                record.budgets.append(adder.snapshot_budget())
            result = record.verdict = adder.add_one_req(req)
            if result is not AddResult.CONTINUE:
                if result is AddResult.NO_TOKEN:
                    self.running.batch_is_full = bool(adder.can_run_list) or bool(self.running.reqs)
                record.stopped_at = req
                record.stop_cause = "verdict"
                break
        return record

    def _get_new_prefill_batch(self) -> ScheduledBatch | None:
        chunked = self.chunked_req
        record = self.run_admission()
        adder = record.adder
        if adder is None or not adder.can_run_list:
            self.requeue_preempted(record.preempted)
            return None
        admitted = adder.can_run_list
        # Admission walks the queue in order and stops at the first failure, so the requests it took
        # from the queue are its head.
        taken = len(admitted) - (chunked is not None)
        assert all(
            a is b for a, b in zip(self.waiting[:taken], admitted[-taken:] if taken else [], strict=True)
        )
        self._waiting_tokens -= sum([r.seqlen for r in self.waiting[:taken]])
        del self.waiting[:taken]
        self.requeue_preempted(record.preempted)
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        self._stash_chunk = self.chunked_req is not None
        if self.page_size > 1:  # SGLang evicts for the batch's tokens plus a fresh page per request
            evict_for(self.cache, self.pool, sum([r.fill_len - len(r.kv) + self.page_size for r in admitted]))
        self._check_prefill_fits(admitted)
        for req in admitted:
            if req is not chunked:
                self.req_slots.alloc()
            self._alloc_kv(req, req.fill_len - len(req.kv))
        # (#running-req as SGLang logs it: after any preemption)
        stats = self._prefill_stats(adder, len(self.running.reqs))
        batch = ScheduledBatch(kind="prefill", reqs=admitted, chunked=self.chunked_req, stats=stats)
        return self.mix_running(batch) if self.mixed_chunk else batch

    def _new_admission_pass(self) -> AdmissionPass:
        return AdmissionPass(
            cache=self.cache,
            pool=self.pool,
            running=self.running,
            new_token_ratio=self.ratio.current,
            page_size=self.page_size,
            profile=self.profile,
            clip_max_new_tokens=self.knobs.clip_max_new_tokens_estimation,
            rem_input_tokens=self.args.max_prefill_tokens,
            rem_chunk_tokens=self.chunked_prefill_size,
            prefill_max_requests=self.args.prefill_max_requests,
            ignore_eos_occupancy_check=self.policy.ignore_eos_occupancy_check,
            mixed_decode_tokens=len(self.running.reqs) if self.mixed_chunk else 0,
        )

    def _check_prefill_fits(self, admitted: list[Req]) -> None:
        """SGLang's crash when a prefill batch outgrows the pool. Admission keeps the forecast inside the
        pool, except for a chunked prompt's next piece: with nothing left of the budget SGLang still takes a
        whole chunk (`available_chunk_tokens`: "must make progress"), and with mixed chunks the running
        requests' decode rows may have eaten the pool in the meantime. SGLang then evicts what it can and
        raises; so does kvadmit, with SGLang's message (crosscheck: the allocation fails at the same step)."""
        pool = self.pool
        tokens = sum([r.fill_len - len(r.kv) for r in admitted])
        pages = sum([pool.pages_needed(len(r.kv), r.fill_len - len(r.kv)) for r in admitted])
        if pages * pool.page_size <= pool.available_size() + self.cache.evictable_size():
            return
        evict_for(self.cache, pool, pages * pool.page_size)
        available, evictable = pool.available_size(), self.cache.evictable_size()
        raise EngineCrash(out_of_memory_message(tokens, available, evictable, self.page_size))

    def _alloc_kv(self, req: Req, n: int) -> None:
        """Give `req` slots for `n` more tokens, evicting unlocked cache first if the pool is short."""
        if n <= 0:
            return
        evict_for(self.cache, self.pool, self.pool.pages_needed(len(req.kv), n) * self.pool.page_size)
        req.kv.extend(self.pool.alloc_extend(req.kv, n))

    def _update_running_batch(self) -> ScheduledBatch | None:
        running = self.running
        initial_bs = len(running.reqs)
        self._drop_finished()  # (batch_is_full follows from initial_bs below)
        finishing = self.drop_finishing_in_flight()
        if not running.reqs:
            running.batch_is_full = False
            return None

        outcome = self.check_decode_or_retract(finishing_in_flight=bool(finishing))
        if outcome is DECODE_SKIPPED:
            # Overlap loop: the result in flight frees the finishing requests' KV; decode the rest on
            # the next pass rather than retract them (no retraction, no decay).
            running.batch_is_full = False
            return None
        if outcome is None:
            self.ratio.decay_step()
        if len(running.reqs) < initial_bs:
            running.batch_is_full = False
        if not running.reqs:
            return None
        self.alloc_decode_slots()
        return ScheduledBatch(
            kind="decode",
            reqs=list(running.reqs),
            kv_tokens=running.kv_tokens,
            kvs=list(running.kvs),
            outs=list(running.outs),
        )

    def is_fully_idle(self) -> bool:
        return not self.running.reqs and self.chunked_req is None and not self.waiting

    def _on_idle(self) -> None:
        # SGLang's loop spins while idle, so an idle pass is always followed by another before new work
        # arrives; the reset that its `last_batch` lag delays by one pass is therefore taken here.
        if self.is_fully_idle():
            self.ratio.reset()

    # ===== accounting ===========================================================================
    def drain_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    def check_invariants(self) -> None:
        """docs/architecture.md's pool accounting (scheduler/invariants.py)."""
        check_invariants(self)

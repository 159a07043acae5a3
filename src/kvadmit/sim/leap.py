"""Leaps: runs of uneventful decode steps at a fraction of a step's cost, with every output byte-identical
to stepping (docs/leaps.md).

A decode step is *quiet* when stepping it could change nothing but counters: no request arrives before
it starts, admission cannot run (the queue is empty, or the batch is full and no preemption), every
request gets its slot without eviction or retraction, no request ends (no EOS from the executor, none
reaches max_new_tokens, no client abort), no chunked prefill is in progress. A quiet step still does,
exactly as stepping would and in the same order, everything whose result is a number: the new-token
ratio's decay, the pool's allocation (the same slot ids), the step's cost from the cost model, the clock,
the step counters, the decode log line every --decode-log-interval steps, the step observers (step trace,
the client's token times, a replica's KV usage). What it puts off is the per-request work: each request's
tokens are appended in bulk (`_flush`) when the run of quiet steps ends, or before anything reads a
request's lengths (the decode log line's #seq-len sum); so are its KV pages at page size > 1. At page size
1 a quiet step's slots go to the running batch as an ordinary step's do (owed there, owed_slots.py).

`Leaper.leap(bound, max_rounds)` runs quiet steps while each starts before `bound` (the next arrival)
and returns how many it ran; 0 means the next step is not quiet: the caller runs it with Engine.step().
Nothing may touch the engine between a leap and the next leap() call but what a caller does between two
steps anyway (hand requests over); every Engine.step() must come after a leap() that returned 0.

Both of SGLang's loops are covered. In the overlap loop a step is: the pass that schedules decode batch
n, processing batch n − 1's result (due when it was launched), launching batch n. Batch n's result is
computed at launch: if the executor's EOS falls in it, it is launched for real and the run ends there
(the next step processes it, with its finish, as stepping does).
"""

from __future__ import annotations

from array import array
from collections import deque
from itertools import repeat

from kvadmit.engine import Engine, VirtualClock
from kvadmit.executor.base import StepResult
from kvadmit.executor.simulated import TEXT_TOKEN_ID, SimulatedExecutor
from kvadmit.request import Req
from kvadmit.scheduler.batch import RunningBatch
from kvadmit.scheduler.scheduler import ScheduledBatch

# A request whose length-due step is this close is left to real steps (1 would do: the drop of requests
# finishing in flight looks one step ahead; the rest is margin).
_HORIZON = 3


class Leaper:
    def __init__(self, engine: Engine, executor: SimulatedExecutor, clock: VirtualClock) -> None:
        self.engine = engine
        self.executor = executor
        self.clock = clock
        s = engine.scheduler
        self.sched = s
        self.page = s.page_size
        self.overlap = engine.overlap
        # Settings under which no step is quiet: forced retractions, a stop-string checker (it reads the
        # text every step).
        self.enabled = not s.knobs.test_retract and s.stop_checker is None
        self.armed = False
        self.run: RunningBatch | None = None
        self.reqs: list[Req] = []
        self.kvs: list[array[int]] = []
        self.outs: list[list[int]] = []
        self.text: list[int] = []  # a quiet step's tokens
        self.result: StepResult | None = None  # the last quiet step's result (_result)
        self.batch: ScheduledBatch | None = None  # non-overlap: the batch every quiet step reports
        self.spare: ScheduledBatch | None = None  # overlap: a batch of ours whose result was processed
        self.pending_quiet = False  # overlap: the result in flight has no stop token
        self.above_rounds = 0  # steps before a request above the reservation clip could drop to it
        self.rounds = 0  # quiet steps since armed
        self.total = 0  # quiet steps run
        self.tokens_owed = 0  # quiet steps whose token each running request has not been given yet
        self.kv_owed = 0  # page size > 1: quiet steps whose slot each running request has not been given yet
        self.pages: dict[int, list[int]] = {}  # page size > 1: request position → pages it took
        self.groups: list[list[int]] = []  # page size > 1: positions by (−len(kv)) mod page size

    # ----- arming: may the steps from here on be quiet? -------------------------------------------
    def _arm(self) -> bool:
        s, eng = self.sched, self.engine
        run = s.running
        if s.chunked_req is not None or s._finished_positions or s._abort_rids or not run.reqs:
            return False
        if s.waiting and not (run.batch_is_full and not s.prio.preemption):
            return False  # (the cheap checks first: most steps of a busy run fail one of them)
        last = s.last_batch
        if last is None or last.kind != "decode" or TEXT_TOKEN_ID in s._stop_token_union:
            return False
        if self.overlap:
            pending = eng.pending
            if pending is None or pending[0] is not last or s.in_flight is not last:
                return False
            if self.executor.eos_due() or last.finish_stamp != s._finish_count:
                return False
            # its result must take the fast path (the same requests, none ended since) and end none
            if last.reqs != run.reqs or s._stop_positions(pending[1].next_token_ids, pending[1].filler):
                return False
            self.pending_quiet = True
        elif eng.pending is not None or s.in_flight is not None or self.executor.eos_due():
            return False
        self.run = run
        due = run._due
        if due and due[0][0] <= run._steps + _HORIZON and self._live_due(run._steps + _HORIZON):
            self.run = None
            return False
        self.above_rounds = min(
            (r.max_new_tokens - len(r.output_ids) - run.clip for r in run._above), default=1 << 62
        )
        if last.reqs == run.reqs and last.kvs is not None and last.outs is not None:
            self.reqs, self.kvs, self.outs = last.reqs, last.kvs, last.outs  # the batch's own copies
        else:
            self.reqs, self.kvs, self.outs = list(run.reqs), list(run.kvs), list(run.outs)
        self.text = [TEXT_TOKEN_ID] * len(self.reqs)
        self.batch = None if self.overlap else self._decode_batch()
        self.spare = None
        self.rounds = 0
        if self.page > 1:
            self._group_by_page_room()
        self.armed = True
        return True

    def _decode_batch(self) -> ScheduledBatch:
        return ScheduledBatch(
            kind="decode", reqs=self.reqs, kv_tokens=self.run.kv_tokens if self.run else 0,
            kvs=self.kvs, outs=self.outs,
        )  # fmt: skip

    def _group_by_page_room(self) -> None:
        p = self.page
        self.groups = [[] for _ in range(p)]
        for i, kv in enumerate(self.kvs):
            self.groups[-len(kv) % p].append(i)
        self.pages = {}

    # ----- one quiet step ---------------------------------------------------------------------------
    def _rounds_allowed(self, max_rounds: int) -> int:
        """How many of the next steps may be quiet as far as what cannot change during a leap call says:
        nothing reached the engine that makes a pass admit, retract or end a request; page size 1: every
        step's slots are free without eviction; no request above the reservation clip drops to it."""
        s, run = self.sched, self.run
        assert run is not None
        if s.running is not run or s._abort_rids or (self.overlap and not self.pending_quiet):
            return 0
        if s.waiting and not (run.batch_is_full and not s.prio.preemption):
            return 0  # an admission pass would run
        n = len(self.reqs)
        allowed = min(max_rounds, self.above_rounds - self.rounds - 1)
        if self.page == 1:  # step r (from 0) starts with available − r·n slots free and needs n
            allowed = min(allowed, s.pool.available_size() // n)
        return allowed

    def _round_quiet(self, bound: float) -> bool:
        """The checks that change from step to step, at the step's start."""
        if self.clock.t >= bound:
            return False  # a request reaches the engine first
        if self.page > 1 and self.sched.pool.available_size() < len(self.reqs) * self.page:
            return False  # alloc_decode_slots would evict (it asks for a page per request)
        if not self.overlap and self.executor.eos_due():
            return False
        run = self.run
        assert run is not None
        due, horizon = run._due, run._steps + _HORIZON
        return not (due and due[0][0] <= horizon and self._live_due(horizon))

    def _live_due(self, bound: int) -> bool:
        """Does a running request have a length-due entry at or before step `bound`? (Entries of requests
        that ended or left are skipped, as reached_length skips them.)"""
        run = self.run
        assert run is not None
        due, members = run._due, run.member_ids
        stack = [0]
        while stack:
            i = stack.pop()
            if i >= len(due) or due[i][0] > bound:
                continue
            req = due[i][2]
            if req.finished_reason is None and id(req) in members:
                return True
            stack += (2 * i + 1, 2 * i + 2)
        return False

    def _pass(self) -> None:
        """The scheduling pass of a quiet step: admission gated off, the decode memory check passes, the
        ratio decays, every running request gets a slot (SGLang's prepare_for_decode)."""
        s, run = self.sched, self.run
        assert run is not None
        if s._dropped_finishing:
            s._dropped_finishing = []
        if s._left_in_pass:
            s._left_in_pass = []
        if s.prio.preemption:
            run.batch_is_full = False  # run_admission's first line; the queue is empty
        s.ratio.decay_step()
        pool, n = s.pool, len(self.reqs)
        if self.page == 1:
            # as a decode step gives them: into the running batch, owed there with its own steps' slots
            # (scheduler/owed_slots.py; or appended at once where the scheduler does not defer them)
            run.take_decode_slots(pool)
        else:
            pages = self.pages
            for i in self.groups[self.kv_owed % self.page]:  # those whose KV fills whole pages, in order
                pages.setdefault(i, []).append(pool._take_pages(1)[0])
            self.kv_owed += 1
            run.kv_tokens += n
        s.forward_ct += 1
        # next_batch: keep the finish log back to the oldest batch whose result is still to come
        oldest = s.in_flight.finish_stamp if s.in_flight is not None else s._finish_count
        if oldest > s._finish_log_base:
            del s._finish_log[: oldest - s._finish_log_base]
            s._finish_log_base = oldest

    def _process(self, batch: ScheduledBatch, result: StepResult) -> None:
        """A quiet decode result: _process_decode's fast path with the tokens owed, then the engine's
        observers and listener at the step's end."""
        s, run, eng = self.sched, self.run, self.engine
        assert run is not None
        self.tokens_owed += 1
        run.after_decode_step()
        if run.reached_length():
            raise AssertionError("a quiet step reached a request's length")
        if (s.forward_ct_decode + 1) % s.decode_log_interval == 0:
            self._flush()  # the decode log line sums the requests' lengths
        s._after_decode(batch)
        now = self.clock.now()
        for watch in eng.step_observers:
            watch(batch, result, now)
        eng.listener.on_step(batch, now)
        eng._dispatch(now)

    def _step_plain(self) -> None:
        s, eng = self.sched, self.engine
        batch = self.batch
        assert batch is not None and self.run is not None
        start = self.clock.now()
        self._pass()
        batch.kv_tokens = self.run.kv_tokens
        s.last_batch = batch
        batch.finish_stamp = s._finish_count
        seconds = self.executor.quiet_decode(len(self.reqs), self.run.kv_tokens)
        eng.launched += 1
        self.clock.wait_until(start + seconds)
        self._process(batch, self._result(seconds))

    def _step_overlap(self) -> None:
        s, eng = self.sched, self.engine
        assert eng.pending is not None and self.run is not None
        self._pass()
        # two batch objects take turns: the one in flight and the one being scheduled
        batch = self.spare if self.spare is not None and self.spare is not eng.pending[0] else None
        if batch is None:
            batch = self._decode_batch()
        else:
            batch.kv_tokens = self.run.kv_tokens
        self.spare = eng.pending[0] if eng.pending[0].reqs is self.reqs else None
        s.last_batch = batch
        batch.finish_stamp = s._finish_count
        s.in_flight = batch
        last, result, ready = eng.pending
        self.clock.wait_until(ready)
        self._process(last, result)
        start = self.clock.now()
        if self.executor.eos_due():  # this batch ends a request: launch it for real
            self._flush()
            result = self.executor.run(batch)
            self.pending_quiet = False
        else:
            result = self._result(self.executor.quiet_decode(len(self.reqs), batch.kv_tokens))
        eng.launched += 1
        eng.pending = (batch, result, start + result.seconds)

    def _result(self, seconds: float) -> StepResult:
        """A quiet step's result: the last one while the tokens and the time are the same (nothing
        changes a result)."""
        r = self.result
        # (never a zero time: 0.0 and −0.0 are equal and print differently)
        if r is None or r.next_token_ids is not self.text or r.seconds != seconds or not seconds:
            r = self.result = StepResult(self.text, seconds)
        return r

    # ----- the public part ----------------------------------------------------------------------------
    def leap(self, bound: float = float("inf"), max_rounds: int = 1 << 62) -> int:
        """Run quiet steps while each starts before `bound`, at most `max_rounds`; how many ran. At 0 the
        owed work is done and the next step is the caller's (Engine.step)."""
        if not self.enabled:
            return 0
        if not self.armed and not self._arm():
            return 0
        done, allowed = 0, self._rounds_allowed(max_rounds)
        step = self._step_overlap if self.overlap else self._step_plain
        while done < allowed and self._round_quiet(bound):
            step()
            done += 1
            if self.overlap and not self.pending_quiet:
                break  # its result ends a request
        self.rounds += done
        self.total += done
        if done == 0:
            self.settle()
        return done

    def settle(self) -> None:
        """Do the owed per-request work and disarm (before the engine runs a step of its own)."""
        if self.armed:
            self._flush()
            self.armed = False
            self.run = None
            self.batch = None
            self.spare = None
            self.reqs, self.kvs, self.outs = [], [], []

    def _flush(self) -> None:
        """Give every running request its owed tokens and (page size > 1) KV pages, as the quiet steps
        would have. (Page size 1: the running batch holds the quiet steps' slots, see _pass.)"""
        n, b = self.tokens_owed, len(self.reqs)
        if n:
            block = [TEXT_TOKEN_ID] * n
            deque(map(list.extend, self.outs, repeat(block, b)), maxlen=0)
            self.tokens_owed = 0
        if self.kv_owed:
            self._flush_pages()
            self.kv_owed = 0

    def _flush_pages(self) -> None:
        p, owed = self.page, self.kv_owed
        for i, kv in enumerate(self.kvs):
            last, room = kv[-1], -len(kv) % p
            take = min(room, owed)
            kv.extend(range(last + 1, last + 1 + take))  # the rest of its last page, then new pages
            left = owed - take
            for page in self.pages.get(i, ()):
                n = min(p, left)
                kv.extend(range(page * p, page * p + n))
                left -= n
            assert left == 0, "owed slots without pages"
        self._group_by_page_room()

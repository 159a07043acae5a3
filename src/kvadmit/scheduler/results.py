"""Results in: apply one step's sampled tokens, end requests (length, stop, abort) and hand their KV to
the prefix cache. A mixin of Scheduler, kept apart because the decode step's hot loop lives here."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from operator import attrgetter

from kvadmit.memory.pool import ReqSlotPool, TokenPool
from kvadmit.memory.radix import RadixCache
from kvadmit.request import FinishKind, FinishReason, Req
from kvadmit.scheduler.admission import AdmissionPass
from kvadmit.scheduler.batch import RunningBatch
from kvadmit.scheduler.events import DecodeBatchStats, Event, PrefillBatchStats, RequestAborted
from kvadmit.scheduler.ratio import NewTokenRatio
from kvadmit.scheduler.traits import trait
from kvadmit.scheduler.types import ScheduledBatch, StepOutcome

_PROMPT = attrgetter("origin_input_ids")
_OUTPUTS = attrgetter("output_ids")

CLIENT_ABORT_MESSAGE = "Aborted by the client."
_NO_IDS: frozenset[int] = frozenset()


@trait
class StepResults:
    """on_batch_done and what it needs; the state it reads belongs to Scheduler."""

    running: RunningBatch
    cache: RadixCache
    req_slots: ReqSlotPool
    waiting: list[Req]
    chunked_req: Req | None
    events: list[Event]
    stop_checker: Callable[[Req], str | None] | None
    forward_ct_decode: int
    decode_log_interval: int
    _generated_since_log: int
    _finished_positions: list[int]  # running-batch positions of requests that ended this step
    _dropped_finishing: list[Req]
    _finish_count: int
    _finish_log: list[Req]  # requests ended since finish count _finish_log_base (see next_batch)
    _finish_log_base: int
    _left_in_pass: list[Req]  # retracted or aborted by the last pass
    _stash_chunk: bool
    last_batch: ScheduledBatch | None
    in_flight: ScheduledBatch | None
    _waiting_tokens: int
    _stop_token_union: frozenset[int]
    _abort_rids: set[str]

    pool: TokenPool
    max_total_num_tokens: int
    ratio: NewTokenRatio

    def _prefill_stats(self, adder: AdmissionPass, running_bs: int) -> PrefillBatchStats:
        pending = self._waiting_tokens
        if self.chunked_req is not None:
            pending += self.chunked_req.seqlen - self.chunked_req.fill_len
        hit = sum(
            r.prefix_len for r in adder.can_run_list if not r.is_retracted and r is not self.chunked_req
        )
        used = self.num_used_tokens()
        return PrefillBatchStats(
            new_seq=len(adder.can_run_list),
            new_token=adder.log_input_tokens,
            cached_token=adder.log_hit_tokens,
            num_used_tokens=used,
            token_usage=used / self.max_total_num_tokens,
            running_req=running_bs,
            queue_req=len(self.waiting),
            pending_token=pending,
            new_token_ratio=self.ratio.current,
            hit_tokens_for_rate=hit,
            input_tokens_for_rate=adder.log_input_tokens,
            reprocessed_input_tokens=adder.reprocessed_log_input_tokens,
        )

    def num_used_tokens(self) -> int:
        """SGLang's `#token`: pool − (available + evictable); evictable cache does not count as used."""
        return self.max_total_num_tokens - (self.pool.available_size() + self.cache.evictable_size())

    def on_batch_done(
        self, batch: ScheduledBatch, next_token_ids: list[int], filler: tuple[int, list[int]] | None = None
    ) -> StepOutcome:
        """Apply the executor's sampled tokens (one per request, in batch order). `filler`, if the executor
        knows it: a token id and the positions whose token is not that id (_stop_positions)."""
        if len(next_token_ids) != len(batch.reqs):
            raise ValueError(f"expected {len(batch.reqs)} tokens, got {len(next_token_ids)}")
        outcome = StepOutcome()
        # Under the overlap loop the next pass has run since this batch was scheduled (it merged a
        # prefill's requests into the running batch, may have retracted or dropped some) and requests
        # may have ended since (docs/sglang-rules.md A.1).
        passed = self.last_batch is not batch
        if self.in_flight is batch:
            self.in_flight = None
        if batch.kind == "prefill":
            self._process_prefill(batch, next_token_ids, outcome, merged=passed)
        elif self.running.reqs == batch.reqs and self._finish_count == batch.finish_stamp:
            self._process_decode(batch, next_token_ids, outcome, filler)
        else:
            self._process_decode_lagged(batch, next_token_ids, outcome, filler)
        return outcome

    def _process_prefill(
        self, batch: ScheduledBatch, tokens: list[int], outcome: StepOutcome, merged: bool
    ) -> None:
        running = self.running
        # Under the overlap loop the next pass may already have merged this batch's requests into the running
        # batch (or, with mixed chunks, moved them on into the next batch): only members move its sums.
        members = running.member_ids if merged else _NO_IDS  # (nothing below adds or drops a member)
        decoding = set(map(id, batch.decoding or ()))  # mixed chunk: decode rows are not checkpointed
        for req, token in zip(batch.reqs, tokens, strict=True):
            if req is batch.chunked or _left_in_flight(req):
                continue  # a non-final chunk (its token is discarded), or retracted or ended meanwhile
            member = id(req) in members
            if member:
                running.append_output(req, token)
            else:
                req.output_ids.append(token)
            reason = self._check_finished(req, token)
            if reason is not None:
                at = running.reqs.index(req) if member else -1
                self._finish(req, reason, outcome, at)
                if member:
                    self._finished_positions.append(at)
            elif id(req) not in decoding:
                self.cache.cache_unfinished_req(req, req.fill_len)
        assert batch.stats is not None
        used = self.num_used_tokens()  # the queue and the pool at log time
        self.events.append(batch.stats.at_report(len(self.waiting), used, used / self.max_total_num_tokens))

    def _stash_chunked_req(self) -> None:
        """At the start of a pass SGLang checkpoints the chunk the chunked request computed (its KV goes
        to the prefix cache, so the next chunk and other requests can match it), or ends the request if
        the client aborted it (it runs no further chunk)."""
        req = self.chunked_req
        if req is None or not self._stash_chunk:
            return
        self._stash_chunk = False
        if req.abort_requested:
            self.chunked_req = None
            self._abort_running(req)
            return
        self.cache.cache_unfinished_req(req, req.fill_len)

    def _abort_running(self, req: Req) -> None:
        """End a request the client aborted outside a step's result (the chunked request)."""
        self._finish(req, FinishReason(FinishKind.ABORT, CLIENT_ABORT_MESSAGE, 499), None)

    def _process_decode(
        self,
        batch: ScheduledBatch,
        tokens: list[int],
        outcome: StepOutcome,
        filler: tuple[int, list[int]] | None,
    ) -> None:
        # The hot path of a decode step: one token per running request, appended at C speed; the finish
        # check runs only for requests that may have finished (length reached, a stop token, an abort,
        # or every request when a stop-string checker is set). Batch order is kept throughout.
        reqs = batch.reqs
        running = self.running
        assert running.reqs == reqs, "a decode batch is the running batch, in order"
        deque(map(list.append, running.outs, tokens), maxlen=0)
        running.after_decode_step()
        maybe: Sequence[int]
        if self.stop_checker is not None:
            maybe = range(len(reqs))
        else:
            candidates = running.reached_length() + self._stop_positions(tokens, filler)
            if self._abort_rids:
                candidates += [i for i, r in enumerate(reqs) if r.rid in self._abort_rids]
            maybe = sorted(set(candidates))
        for i in maybe:
            req = reqs[i]
            reason = self._check_finished(req, tokens[i])
            if reason is not None:
                self._finish(req, reason, outcome, i)
                self._finished_positions.append(i)
        self._after_decode(batch)

    def _process_decode_lagged(
        self,
        batch: ScheduledBatch,
        tokens: list[int],
        outcome: StepOutcome,
        filler: tuple[int, list[int]] | None,
    ) -> None:
        """A decode result under the overlap loop after the running batch changed: some of the batch's
        requests were retracted, ended or dropped (finishing by length) since it was scheduled. Those
        retracted or ended get nothing; the running batch is a subset of the batch, and each of its
        members got a token except the ones that had ended (they wait to be dropped, reservation kept).
        The few that left are found from the finish log and the last pass's retractions, so the step
        stays at C speed like the regular one."""
        reqs = batch.reqs
        running = self.running
        same = running.reqs == reqs
        ended = self._finished_since(batch.finish_stamp)
        assert batch.outs is not None
        deque(map(list.append, batch.outs, tokens), maxlen=0)
        skip: set[int] = set()
        for req in [*ended, *self._left_in_pass]:
            i = _position(reqs, req)
            if i is not None and i not in skip:
                req.output_ids.pop()  # it left while the step was in flight: its token is dropped
                skip.add(i)
        running.after_decode_step(
            not_stepped=[r for r in ended if _position(reqs, r) is not None] if same else []
        )
        if self.stop_checker is not None:
            maybe = set(range(len(reqs)))
        else:
            due = [running.reqs[j] for j in running.reached_length()]
            maybe = {i for r in [*due, *self._dropped_finishing] if (i := _position(reqs, r)) is not None}
            maybe.update(self._stop_positions(tokens, filler))
            if self._abort_rids:
                maybe.update(i for i, r in enumerate(reqs) if r.rid in self._abort_rids)
        dropped = set(map(id, self._dropped_finishing))
        for i in sorted(maybe - skip):
            req = reqs[i]
            reason = self._check_finished(req, tokens[i])
            if reason is not None:
                at = i if same else _position(running.reqs, req)
                self._finish(req, reason, outcome, -1 if at is None else at)
                if id(req) not in dropped and at is not None:  # (a mixed chunk may have taken it on)
                    self._finished_positions.append(at)
        self._after_decode(batch)

    def _finished_since(self, stamp: int) -> list[Req]:
        """The requests that ended since the scheduler's finish count was `stamp`."""
        return self._finish_log[stamp - self._finish_log_base :]

    def _after_decode(self, batch: ScheduledBatch) -> None:
        self.forward_ct_decode = (self.forward_ct_decode + 1) % (1 << 30)
        self._generated_since_log += len(batch.reqs)
        if self.forward_ct_decode % self.decode_log_interval == 0:
            used = self.num_used_tokens()
            self.events.append(
                DecodeBatchStats(
                    running_req=len(batch.reqs),
                    num_used_tokens=used,
                    token_usage=used / self.max_total_num_tokens,
                    queue_req=len(self.waiting),
                    generated_tokens=self._generated_since_log,
                    # The step wrote the KV of each request's input token; the token it sampled has none yet.
                    sum_seq_lens=_sum_seqlens(batch.reqs) - len(batch.reqs),
                    graph=batch.graph,
                )
            )
            self._generated_since_log = 0

    def _stop_positions(self, tokens: list[int], filler: tuple[int, list[int]] | None = None) -> list[int]:
        """Positions of `tokens` that are a stop token id of any request. With a few stop ids (EOS and
        the like), C-speed scans for each beat hashing every token of the batch. `filler` (a token id,
        the positions whose token is not it): if that id stops no request, only those positions can."""
        union = self._stop_token_union
        if filler is not None and filler[0] not in union:
            return [i for i in filler[1] if tokens[i] in union]
        found: list[int] = []
        for stop in union if len(union) <= 4 else union.intersection(tokens):
            found += _positions(tokens, stop)
        return found

    def _append_token(self, req: Req, token: int, outcome: StepOutcome) -> None:
        req.output_ids.append(token)
        reason = self._check_finished(req, token)
        if reason is not None:
            self._finish(req, reason, outcome)

    def _check_finished(self, req: Req, token: int) -> FinishReason | None:
        if req.abort_requested:
            return FinishReason(FinishKind.ABORT, CLIENT_ABORT_MESSAGE, 499)
        # A stop token that lands on the last allowed token ends the request as "stop": SGLang 0.5.22
        # checks stop tokens before the length cap.
        if (
            not req.sampling.ignore_eos
            and token in req.stop_token_ids
            and len(req.output_ids) >= req.min_new_tokens
        ):
            return FinishReason(FinishKind.STOP, matched=token)
        if len(req.output_ids) >= req.max_new_tokens:  # no remaining_new_tokens left
            return FinishReason(FinishKind.LENGTH, matched=None)
        if self.stop_checker is not None:
            matched = self.stop_checker(req)
            if matched is not None:
                return FinishReason(FinishKind.STOP, matched=matched)
        return None

    def _finish(
        self, req: Req, reason: FinishReason, outcome: StepOutcome | None, position: int = -1
    ) -> None:
        """End `req`; `position`: where it is in the running batch, if known (−1: not known, or not in it)."""
        self.running.settle(req, position)  # its owed decode slots, before the cache takes its KV
        req.finished_reason = reason
        self._finish_count += 1
        self._finish_log.append(req)
        self._abort_rids.discard(req.rid)
        if reason.kind is FinishKind.ABORT:
            self.cache.release_req(req)
            self.events.append(RequestAborted(req.rid, reason.message, reason.status_code))
        else:
            self.cache.cache_finished_req(req)
        self.req_slots.free()
        if outcome is not None:
            outcome.finished.append(req)


def _sum_seqlens(reqs: list[Req]) -> int:
    """Σ req.seqlen (prompt + outputs) over `reqs`, summed at C speed (ints: the order cannot matter)."""
    return sum(map(len, map(_PROMPT, reqs))) + sum(map(len, map(_OUTPUTS, reqs)))


def _position(reqs: list[Req], req: Req) -> int | None:
    """Where `req` is in `reqs` (by identity, at C speed), or None."""
    try:
        return reqs.index(req)
    except ValueError:
        return None


def _left_in_flight(req: Req) -> bool:
    """Did the request end, or lose its KV to a retraction, after its batch was scheduled? (A request
    in a batch holds KV until then.)"""
    return req.finished_reason is not None or not req.kv


def _positions(items: list[int], value: int) -> list[int]:
    """Every index of `value` in `items`, found by C-speed scans."""
    found: list[int] = []
    i = -1
    try:
        while True:
            i = items.index(value, i + 1)
            found.append(i)
    except ValueError:
        return found

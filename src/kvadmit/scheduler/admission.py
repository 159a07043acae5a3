"""Admission: which waiting requests join the next prefill batch (SGLang's PrefillAdder, docs/sglang-rules.md
§1).

One `AdmissionPass` is built per scheduling pass. It starts from the pool's free + evictable tokens,
holds back every running request's forecast (remaining max_new_tokens, clipped, × the new-token ratio),
and then takes candidates one at a time until a call returns something other than CONTINUE.

The budget, in SGLang's words:
    rem_total_tokens = available + evictable − total_offset
    cur_rem_tokens   = available + evictable − current_offset
where total_offset starts at the running reservation and both offsets grow by each admitted request's
charge. `rem_total_tokens` is a float once a ratio-scaled reservation is in it; SGLang sums the running
reservations in batch order, and we reproduce that sum exactly whenever a decision is close enough to a
boundary for rounding to matter (see `RunningBatch.fast_reservation`).
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from kvadmit.config import VersionProfile
from kvadmit.memory.pool import TokenPool, ceil_page
from kvadmit.memory.radix import RadixCache
from kvadmit.request import Req
from kvadmit.scheduler.batch import RunningBatch


class AddResult(str, Enum):
    CONTINUE = "CONTINUE"  # keep adding
    NO_TOKEN = "NO_TOKEN"  # out of KV budget
    OTHER = "OTHER"  # any other stop: input or chunk budget spent, request cap, nothing to chunk


IGNORE_EOS_RESERVE_TOKENS = 1  # per request, in the ignore_eos future-occupancy check


def prepare_candidate(req: Req, cache: RadixCache, continuing_chunk: bool = False) -> None:
    """SGLang's `init_next_round_input`: match the prompt (+ outputs of a retracted request) against the
    prefix cache and set this round's prefix and extend lengths.

    The match is capped at len(prompt + outputs) − 1 so at least one token is computed (it yields the
    logits), then page aligned by the cache. A chunked request continues after the tokens it already has.
    """
    if continuing_chunk:
        req.prefix_len = len(req.kv)
    else:
        key = req.fill_ids() if req.output_ids else req.origin_input_ids  # (no copy of a bare prompt)
        match = cache.match_prefix(key, len(key) - 1)
        req.match_node = match.last_node
        req.match_slots = match.value
        req.prefix_len = len(match.value)
    seqlen = len(req.origin_input_ids) + len(req.output_ids)  # req.seqlen, read once
    req.fill_len = seqlen
    req.extend_input_len = seqlen - req.prefix_len
    req.examined_fill_len = seqlen


class Budget(NamedTuple):
    """The budget at one moment of a pass, exactly (for explanations and snapshot answers)."""

    available: int
    evictable: int
    running_reservation: float | int
    charged: int  # Σ charges of the requests admitted so far this pass
    rem_total_tokens: float | int
    cur_rem_tokens: int
    rem_input_tokens: int
    rem_chunk_tokens: int | None


class AdmissionPass:
    """One pass of admission over the waiting queue. Mutates the candidates it admits (locks their
    cached prefix, sets their extend length) and nothing else; allocation happens after the pass."""

    def __init__(
        self,
        *,
        cache: RadixCache,
        pool: TokenPool,
        running: RunningBatch,
        new_token_ratio: float,
        page_size: int,
        profile: VersionProfile,
        clip_max_new_tokens: int,
        rem_input_tokens: int,
        rem_chunk_tokens: int | None,
        prefill_max_requests: int | None = None,
        ignore_eos_occupancy_check: bool = True,
        mixed_decode_tokens: int = 0,
    ) -> None:
        """`mixed_decode_tokens` (--enable-mixed-chunk): the running requests' decode rows that ride in
        this prefill batch, one token each, taken from the input and chunk budgets and counted as used
        from the start, as SGLang's PrefillAdder and PrefillBudget take num_mixed_decode_tokens."""
        self.cache = cache
        self.pool = pool
        self.running = running
        self.ratio = new_token_ratio
        self.page_size = page_size
        self.profile = profile
        self.clip = clip_max_new_tokens
        self.rem_input_tokens = rem_input_tokens - mixed_decode_tokens
        self.rem_chunk_tokens = (
            rem_chunk_tokens - mixed_decode_tokens if rem_chunk_tokens is not None else None
        )
        self.prefill_max_requests = prefill_max_requests
        # False under an --admission-policy other than sglang: every request takes the normal path.
        self.ignore_eos_occupancy_check = ignore_eos_occupancy_check

        self.can_run_list: list[Req] = []
        self.new_chunked_req: Req | None = None
        self.log_hit_tokens = 0
        self.log_input_tokens = 0
        self.reprocessed_log_input_tokens = 0  # the part of log_input_tokens that retracted requests redo

        self.current_offset = mixed_decode_tokens
        # what each admission added to total_offset, in order (and, negated, what each preemption took out);
        # SGLang's total_offset starts at the mixed decode tokens (float addition commutes: the same value)
        self._charges: list[float | int] = [mixed_decode_tokens] if mixed_decode_tokens else []
        self._charge_sum = mixed_decode_tokens
        self._base_fast, self._base_err = running.fast_reservation(new_token_ratio)
        self._base_exact: float | None = None
        self._eos_states: list[tuple[float, int]] | None = None
        self._exact_only = False  # after a preemption: every budget test takes the exact sum

    # ----- the budget ------------------------------------------------------------------------
    def available_and_evictable(self) -> int:
        return self.pool.available_size() + self.cache.evictable_size()

    @property
    def cur_rem_tokens(self) -> int:
        return self.available_and_evictable() - self.current_offset

    @property
    def rem_total_tokens(self) -> float | int:
        """Exactly SGLang's value: running reservations summed in batch order, then each charge."""
        if self._base_exact is None:
            self._base_exact = self.running.exact_reservation(self.ratio)
        offset = self._base_exact
        for charge in self._charges:
            offset += charge
        return self.available_and_evictable() - offset

    def snapshot_budget(self) -> Budget:
        rem_total = self.rem_total_tokens  # computes the exact running reservation
        assert self._base_exact is not None
        return Budget(
            available=self.pool.available_size(),
            evictable=self.cache.evictable_size(),
            running_reservation=self._base_exact,
            charged=self._charge_sum,
            rem_total_tokens=rem_total,
            cur_rem_tokens=self.cur_rem_tokens,
            rem_input_tokens=self.rem_input_tokens,
            rem_chunk_tokens=self.rem_chunk_tokens,
        )

    def _rem_total_fast(self) -> tuple[float, float]:
        """rem_total_tokens from the running sums, and a bound on its distance from the exact value:
        the reservation's own bound plus one rounding per charge and per operation here."""
        if self._exact_only:
            return 0.0, float("inf")
        ae = self.available_and_evictable()
        offset = self._base_fast + self._charge_sum
        err = self._base_err + (len(self._charges) + 4) * 2.0**-52 * (ae + abs(offset) + 1.0)
        return ae - offset, err

    def _fits(self, tokens: int) -> bool:
        """tokens < rem_total_tokens, decided exactly (the fast sum is trusted only away from the edge)."""
        fast, err = self._rem_total_fast()
        if abs(fast - tokens) > err:
            return tokens < fast
        return tokens < self.rem_total_tokens

    def _exceeds(self, tokens: int) -> bool:
        """tokens > rem_total_tokens, decided exactly."""
        fast, err = self._rem_total_fast()
        if abs(fast - tokens) > err:
            return tokens > fast
        return tokens > self.rem_total_tokens

    def _int_rem_total(self) -> int:
        """int(rem_total_tokens) (truncation toward zero), decided exactly."""
        fast, err = self._rem_total_fast()
        if abs(fast - round(fast)) > err:
            return int(fast)
        return int(self.rem_total_tokens)

    def budget_state(self) -> AddResult:
        if not self._fits(0) or self.cur_rem_tokens <= 0:
            return AddResult.NO_TOKEN
        if self.rem_input_tokens <= 0:
            return AddResult.OTHER
        if self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0:
            return AddResult.OTHER
        return AddResult.CONTINUE

    def _charge(self, prefix_len: int, extend: int, reserved_new: int, retracted: bool = False) -> None:
        """SGLang's _update_prefill_budget: an admitted prefill of `extend` tokens (page-ceiled) plus
        one page of overhead, plus the output tokens it reserves."""
        e = ceil_page(extend, self.page_size)
        charge = e + self.page_size + reserved_new
        self._charges.append(charge)
        self._charge_sum += charge
        self.current_offset += e + self.page_size
        self.rem_input_tokens -= e
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= e
        self.log_hit_tokens += prefix_len
        logged = extend if self.profile.log_raw_input_tokens else e
        self.log_input_tokens += logged
        if retracted:
            self.reprocessed_log_input_tokens += logged

    def running_offset(self, req: Req) -> float | int:
        """What running `req` holds back in this pass (SGLang's _get_running_request_total_token_offset)."""
        r = 1.0 if self.running.full_for_ignore_eos and req.sampling.ignore_eos else self.ratio
        return min(req.max_new_tokens - len(req.output_ids), self.running.clip) * r

    def release_running(self, reqs: list[Req]) -> None:
        """Running requests were preempted (before they leave the batch): their reservations leave the
        budget, subtracted one by one in batch order after what was added so far, as SGLang does."""
        if self._base_exact is None:
            self._base_exact = self.running.exact_reservation(self.ratio)
        self._charges.extend(-self.running_offset(r) for r in reqs)
        self._exact_only = True

    # ----- the in-flight chunked request -------------------------------------------------------
    def add_chunked_req(self, req: Req) -> Req | None:
        """Continue a chunked prefill. It must progress, so with no budget left it still takes a
        chunk of rem_chunk_tokens. Returns the request again while its prompt is still unfinished."""
        assert self.rem_chunk_tokens is not None, "a chunked request exists only with chunking on"
        rem = min(self.rem_chunk_tokens, self._int_rem_total())
        if rem <= 0:
            rem = self.rem_chunk_tokens
        truncated = req.extend_input_len > rem
        extend = min(req.extend_input_len, rem)
        req.extend_input_len = extend
        req.fill_len = req.prefix_len + extend
        self.can_run_list.append(req)
        reserved = 0 if truncated else min(req.max_new_tokens, self.clip)
        self._charge(0, extend, reserved, req.is_retracted)  # continuations log no cached tokens
        return req if truncated else None

    # ----- a waiting request -----------------------------------------------------------------
    def add_one_req(self, req: Req) -> AddResult:
        """Try to admit `req` (already prepared by `prepare_candidate`). The verdict returned is about
        the *next* candidate: a request can be admitted and the call still return NO_TOKEN or OTHER."""
        if self.prefill_max_requests is not None and len(self.can_run_list) >= self.prefill_max_requests:
            return AddResult.OTHER
        if req.sampling.ignore_eos and not self.cache.enabled and self.ignore_eos_occupancy_check:
            return self._add_one_req_ignore_eos(req)

        extend = req.extend_input_len
        # The fit test uses the *remaining* output; the charge below reserves the full max_new_tokens.
        max_new = min(max(req.remaining_new_tokens, 0), self.clip)
        total = extend + max_new + (self.page_size if self.profile.page_size_in_fit_check else 0)
        no_chunking = self.rem_chunk_tokens is None
        input_check = no_chunking or self.profile.input_budget_check_with_chunking

        if not self.profile.page_size_in_fit_check:
            # Classic order: fit before locking, then the input budget, then fit again after locking.
            if not self._fits(total):
                return AddResult.NO_TOKEN
            if (
                input_check
                and self.can_run_list
                and ceil_page(extend, self.page_size) >= self.rem_input_tokens
            ):
                return AddResult.OTHER

        # Lock the matched prefix: its tokens stop counting as evictable, so the budget may shrink.
        assert req.match_node is not None
        self.cache.inc_lock_ref(req.match_node)
        if not self._fits(total):
            self.cache.dec_lock_ref(req.match_node)
            return AddResult.NO_TOKEN
        if (
            self.profile.page_size_in_fit_check
            and input_check
            and self.can_run_list
            and ceil_page(extend, self.page_size) >= self.rem_input_tokens
        ):
            self.cache.dec_lock_ref(req.match_node)
            return AddResult.OTHER
        if not self._commit(req):
            self.cache.dec_lock_ref(req.match_node)
            return AddResult.OTHER
        return self.budget_state()

    def _commit(self, req: Req, whole_pages: bool = True) -> bool:
        """Admit `req` whole or as a first chunk (its lock is already taken). False: no room for a chunk.
        `whole_pages` False (the ignore_eos path without a cache): the prompt is whole if its raw length
        fits what is left of the chunk budget, and a first chunk takes all of it, page aligned or not.
        The two differ only when that budget is not a page multiple: mixed decode rows took from it."""
        extend = req.extend_input_len
        chunk_limit = self.rem_chunk_tokens
        page = self.page_size
        measured = ceil_page(extend, page) if whole_pages else extend
        too_long = chunk_limit is not None and measured > chunk_limit
        if too_long:
            assert chunk_limit is not None
            # Chunk to whole pages of what is left of the chunk budget; the prefix is page aligned,
            # so the chunk's end is too. A non-final chunk reserves no output tokens.
            extend = chunk_limit // page * page if whole_pages else chunk_limit
            if extend <= 0:
                return False
            reserved = 0
            self.new_chunked_req = req
        else:
            reserved = min(req.max_new_tokens, self.clip)
        req.extend_input_len = extend
        req.fill_len = req.prefix_len + extend
        if req.retraction_count == 0:
            req.cached_tokens = req.prefix_len
        req.last_node = req.match_node
        req.kv = req.match_slots[:]  # a copy: the request's own slot array grows from here
        req.cached_len = len(req.match_slots)
        self.can_run_list.append(req)
        self._charge(req.prefix_len, extend, reserved, req.is_retracted)
        return True

    def _add_one_req_ignore_eos(self, req: Req) -> AddResult:
        """The path for ignore_eos requests when the prefix cache is disabled (docs/sglang-rules.md §1.6)."""
        paged_input = ceil_page(req.extend_input_len, self.page_size) + self.page_size
        if paged_input > self.cur_rem_tokens or self._exceeds(paged_input):
            return AddResult.NO_TOKEN
        if self._eos_states is None:
            # Built once per pass: the candidate, the running requests, those admitted so far.
            states: list[tuple[float, int]] = []
            self._add_eos_state(states, req)
            for r in self.running.reqs:
                self._add_eos_state(states, r)
            for r in self.can_run_list:
                self._add_eos_state(states, r)
            states.sort(key=lambda s: s[0])
            self._eos_states = states
        else:
            self._add_eos_state(self._eos_states, req, insert_sorted=True)

        # Walk the requests in the order they will finish; each must still find a free slot per
        # step for everyone left, after the earlier ones have freed their tokens.
        cur = self.cur_rem_tokens - paged_input
        freed = 0
        states = self._eos_states
        for i, (tokens_left, tokens_occupied) in enumerate(states):
            left_in_batch = len(states) - i
            min_free = cur + freed - tokens_left * left_in_batch
            if min_free <= IGNORE_EOS_RESERVE_TOKENS * left_in_batch:
                return AddResult.NO_TOKEN
            freed += tokens_occupied
        if not self._commit_without_cache(req):
            return AddResult.OTHER
        return self.budget_state()

    def _add_eos_state(self, states: list[tuple[float, int]], r: Req, insert_sorted: bool = False) -> None:
        ratio = 1.0 if r.sampling.ignore_eos else self.ratio
        tokens_left = r.max_new_tokens * ratio - len(r.output_ids)  # not clipped here
        tokens_occupied = len(r.origin_input_ids) + len(r.output_ids)
        if tokens_left <= 0:
            return
        if not insert_sorted:
            states.append((tokens_left, tokens_occupied))
            return
        # SGLang's insertion: the first entry with tokens_left ≥ ours, else one place before the end
        # (not at the end) — slightly more conservative, reproduced as is (docs/sglang-rules.md §10).
        # (Written without reading a for-range variable after its loop: compiled by mypyc, that variable
        # ends one past the last index, and "before the end" became "at the end".)
        at = max(len(states) - 1, 0)
        for i, (left, _) in enumerate(states):
            if tokens_left <= left:
                at = i
                break
        states.insert(at, (tokens_left, tokens_occupied))

    def _commit_without_cache(self, req: Req) -> bool:
        assert req.match_node is not None
        self.cache.inc_lock_ref(req.match_node)  # the root: a no-op, kept for symmetry
        if self._commit(req, whole_pages=False):
            return True
        self.cache.dec_lock_ref(req.match_node)
        return False

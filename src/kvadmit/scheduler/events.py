"""Typed events the scheduler emits. Observers (log lines, metrics, traces) turn them into output;
the scheduler itself never formats text or reads a clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# object.__setattr__, read once: a frozen dataclass's __init__ sets its fields through it (looking it up on
# `object` at each call was most of such an __init__'s cost in the compiled core).
_set_field: Final = object.__setattr__


@dataclass(slots=True)
class PrefillBatchStats:
    """One prefill batch, emitted when its result has been processed (SGLang's report_prefill_stats)."""

    new_seq: int  # requests in the batch (a chunk continuation counts)
    new_token: int  # tokens computed (raw extend lengths, chunk pieces included)
    cached_token: int  # prefix tokens served from the cache (0 for chunk continuations)
    num_used_tokens: int  # pool − (available + evictable), once the batch's results are processed
    token_usage: float  # num_used_tokens / pool size
    running_req: int  # running batch size when the batch was formed (excludes the new batch)
    queue_req: int  # waiting requests when the line is printed
    pending_token: int  # Σ seqlen of waiting requests + the chunked request's tokens still to come
    new_token_ratio: float  # the ratio admission used
    hit_tokens_for_rate: int  # cached tokens of non-retracted requests (for sglang:cache_hit_rate)
    input_tokens_for_rate: int
    reprocessed_input_tokens: int = 0  # of input_tokens_for_rate, those of retracted requests (recomputed)

    # Written out (the fields, in order, with their defaults; tests/test_native_inits.py checks): the
    # compiled core builds it natively, where dataclass's generated __init__ is interpreted Python. Not
    # frozen, unlike the other events: two are built for every prefill step, and a frozen class's fields
    # can only be set through object.__setattr__ (about 900 instructions each in the compiled core, 11,000
    # for the object, against a few for a plain field). Nothing changes one once built.
    def __init__(
        self,
        new_seq: int,
        new_token: int,
        cached_token: int,
        num_used_tokens: int,
        token_usage: float,
        running_req: int,
        queue_req: int,
        pending_token: int,
        new_token_ratio: float,
        hit_tokens_for_rate: int,
        input_tokens_for_rate: int,
        reprocessed_input_tokens: int = 0,
    ) -> None:
        self.new_seq = new_seq
        self.new_token = new_token
        self.cached_token = cached_token
        self.num_used_tokens = num_used_tokens
        self.token_usage = token_usage
        self.running_req = running_req
        self.queue_req = queue_req
        self.pending_token = pending_token
        self.new_token_ratio = new_token_ratio
        self.hit_tokens_for_rate = hit_tokens_for_rate
        self.input_tokens_for_rate = input_tokens_for_rate
        self.reprocessed_input_tokens = reprocessed_input_tokens

    def at_report(self, queue_req: int, num_used_tokens: int, token_usage: float) -> PrefillBatchStats:
        """The same stats with the queue and the pool as they are when the line is printed: SGLang reads
        both after the batch's results are processed, so requests that finished in the prefill no longer
        count as used (dataclasses.replace, without its field-by-field introspection: this runs once per
        prefill step)."""
        return PrefillBatchStats(
            self.new_seq,
            self.new_token,
            self.cached_token,
            num_used_tokens,
            token_usage,
            self.running_req,
            queue_req,
            self.pending_token,
            self.new_token_ratio,
            self.hit_tokens_for_rate,
            self.input_tokens_for_rate,
            self.reprocessed_input_tokens,
        )


@dataclass(frozen=True, slots=True)
class DecodeBatchStats:
    """Every decode-log-interval decode batches (SGLang's report_decode_stats)."""

    running_req: int  # the decode batch's size, including requests that finished in it
    num_used_tokens: int
    token_usage: float
    queue_req: int
    generated_tokens: int  # tokens generated since the previous decode line (for gen throughput)
    sum_seq_lens: int = 0  # Σ KV length of the batch's requests after the step (sglang:decode_sum_seq_lens)
    graph: bool = False  # the step ran from a captured graph (the line's "cuda graph: True")

    # Written out (the fields, in order, with their defaults; tests/test_native_inits.py checks): the
    # compiled core builds it natively, where dataclass's generated __init__ is interpreted Python.
    # (Frozen: fields are set as dataclass's own __init__ sets them, through object.__setattr__.)
    def __init__(
        self,
        running_req: int,
        num_used_tokens: int,
        token_usage: float,
        queue_req: int,
        generated_tokens: int,
        sum_seq_lens: int = 0,
        graph: bool = False,
    ) -> None:
        _set_field(self, "running_req", running_req)
        _set_field(self, "num_used_tokens", num_used_tokens)
        _set_field(self, "token_usage", token_usage)
        _set_field(self, "queue_req", queue_req)
        _set_field(self, "generated_tokens", generated_tokens)
        _set_field(self, "sum_seq_lens", sum_seq_lens)
        _set_field(self, "graph", graph)


@dataclass(frozen=True, slots=True)
class Retraction:
    """Requests were retracted before a decode step (or forced to be, under SGLANG_TEST_RETRACT)."""

    rids: tuple[str, ...]
    new_tokens_gained: int
    old_ratio: float
    new_ratio: float
    forced: bool  # True: "Testing retraction." (SGLANG_TEST_RETRACT), the ratio is not printed
    input_tokens: int  # Σ prompt lengths of the retracted requests
    output_tokens: int  # Σ output lengths of the retracted requests


@dataclass(frozen=True, slots=True)
class Preemption:
    """Priority preemption: a more urgent waiting request (`by_rid`) took these running requests' place.
    SGLang prints nothing and counts nothing for it; kvadmit's explanations and traces name it."""

    rids: tuple[str, ...]
    by_rid: str


@dataclass(frozen=True, slots=True)
class LastRequestAborted:
    """The last request of a decode batch still did not fit after all others were retracted."""

    rid: str


@dataclass(frozen=True, slots=True)
class RequestAborted:
    rid: str
    message: str
    status_code: int


@dataclass(frozen=True, slots=True)
class StartupInfo:
    max_total_num_tokens: int
    chunked_prefill_size: int  # as given (−1 when disabled)
    max_prefill_tokens: int
    max_running_requests: int
    context_len: int
    available_mem_gb: float
    device: str = "cuda"


Event = (
    PrefillBatchStats
    | DecodeBatchStats
    | Retraction
    | Preemption
    | LastRequestAborted
    | RequestAborted
    | StartupInfo
)

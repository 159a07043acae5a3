"""A request as the scheduler sees it: prompt, outputs so far, sampling limits and scheduling state."""

from __future__ import annotations

from array import array  # at run time too: the compiled core's dataclasses evaluate their annotations
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from kvadmit.memory.pool import new_slots
from kvadmit.memory.radix import RadixNode
from kvadmit.sampling_params import SamplingParams

DEFAULT_PARAMS = SamplingParams()


class FinishKind(str, Enum):
    LENGTH = "length"  # reached max_new_tokens
    STOP = "stop"  # EOS, a stop token id or a stop string
    ABORT = "abort"  # aborted by the server (with a message)


# object.__setattr__, read once: a frozen dataclass's __init__ sets its fields through it (looking it up on
# `object` at each call was most of such an __init__'s cost in the compiled core).
_set_field: Final = object.__setattr__


@dataclass(frozen=True, slots=True)
class FinishReason:
    kind: FinishKind
    message: str = ""
    status_code: int = 200
    matched: int | str | None = None  # the stop token id or stop string that ended it

    # Written out (the fields, in order, with their defaults; tests/test_native_inits.py checks): the
    # compiled core builds it natively, where dataclass's generated __init__ is interpreted Python.
    # (Frozen: fields are set as dataclass's own __init__ sets them, through object.__setattr__.)
    def __init__(
        self, kind: FinishKind, message: str = "", status_code: int = 200, matched: int | str | None = None
    ) -> None:
        _set_field(self, "kind", kind)
        _set_field(self, "message", message)
        _set_field(self, "status_code", status_code)
        _set_field(self, "matched", matched)


# The budget of a request that asks for no max_new_tokens ("up to the context"), before the scheduler caps it.
MAX_NEW_TOKENS_UNSET = 1 << 30


@dataclass(frozen=True, slots=True)
class SamplingLimits:
    """The sampling parameters that scheduling depends on, as the client asked for them (the sampler
    reads the rest elsewhere). Never changed: what the scheduler grants lives on the Req."""

    requested_max_new_tokens: int | None = 128  # None: as many as the context allows
    ignore_eos: bool = False
    min_new_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()
    priority: int | None = None  # the request's priority (SGLang's `priority` field), None: not given

    # Written out (the fields, in order, with their defaults; tests/test_native_inits.py checks): the
    # compiled core builds it natively, where dataclass's generated __init__ is interpreted Python.
    # (Frozen: fields are set as dataclass's own __init__ sets them, through object.__setattr__.)
    def __init__(
        self,
        requested_max_new_tokens: int | None = 128,
        ignore_eos: bool = False,
        min_new_tokens: int = 0,
        stop_token_ids: frozenset[int] = frozenset(),
        priority: int | None = None,
    ) -> None:
        _set_field(self, "requested_max_new_tokens", requested_max_new_tokens)
        _set_field(self, "ignore_eos", ignore_eos)
        _set_field(self, "min_new_tokens", min_new_tokens)
        _set_field(self, "stop_token_ids", stop_token_ids)
        _set_field(self, "priority", priority)


@dataclass(slots=True, eq=False)
class Req:
    """One request. Identity is the object (eq=False): two requests with equal fields are distinct.

    KV layout: `kv` lists the pool slot of every token whose KV has been computed, in order. Its first
    `cached_len` entries belong to the radix cache (locked through `last_node`); the rest are owned by
    the request and freed or handed to the cache when it ends.

    Output budget: `sampling` keeps what the client asked for; `max_new_tokens`, `min_new_tokens` and
    `stop_token_ids` are what is in force. They start as asked (an unset max_new_tokens as
    MAX_NEW_TOKENS_UNSET); the scheduler caps them when it queues the request (scheduler/output_budget.py)
    and adds the model's EOS ids to the stop ids unless the request ignores EOS.
    """

    rid: str
    origin_input_ids: list[int]  # never changed once queued (the prefix cache may keep this very list)
    sampling: SamplingLimits = field(default_factory=SamplingLimits)
    params: SamplingParams = DEFAULT_PARAMS  # how its tokens are drawn (frozen: one default serves all)
    output_ids: list[int] = field(default_factory=list)
    seq: int = 0  # arrival order, for fcfs ties and deterministic ordering
    # The client's priority (None: not given); with priority scheduling on, add_request resolves it to an
    # int (scheduler/priority.py). Larger is more urgent unless --schedule-low-priority-values-first.
    priority: int | None = None

    # The output budget in force (see above; set by __init__, then by the scheduler).
    max_new_tokens: int = field(init=False)
    min_new_tokens: int = field(init=False)
    stop_token_ids: frozenset[int] = field(init=False)

    # Scheduling state (reset by reset_for_retract).
    kv: array[int] = field(default_factory=new_slots)  # pool slots (a C array, see memory/pool.py)
    cached_len: int = 0  # leading kv slots owned by the prefix cache
    last_node: RadixNode | None = None  # the cache node whose lock this request holds
    prefix_len: int = 0  # tokens this round's prefill need not compute (cache match or earlier chunks)
    match_node: RadixNode | None = None  # this pass's cache match (locked only if admitted)
    match_slots: array[int] = field(default_factory=new_slots)  # the matched prefix's slots
    fill_len: int = 0  # tokens of prompt + outputs this round's prefill computes up to (chunk end)
    extend_input_len: int = 0  # tokens computed by the current prefill (fill_len − prefix_len)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache at its first prefill
    is_retracted: bool = False
    retraction_count: int = 0
    finished_reason: FinishReason | None = None
    abort_requested: bool = False  # the client aborted it; it ends at its next result
    queue_entry: int = 0  # when it last entered the waiting queue (a counter: SGLang's wait_queue_entry_time)
    # len(prompt + outputs) when a prefill pass last prepared it (0: never): SGLang's fill-id array, which
    # priority preemption reads before the candidate is prepared again (scheduler/priority.py)
    examined_fill_len: int = 0

    # Written out (the init fields, in order, with their defaults, then the rest; tests/test_native_inits.py
    # checks): the compiled core builds it natively, where dataclass's generated __init__ is interpreted
    # Python. (`sampling` and `output_ids` left out or passed as None start as their default_factory
    # makes them.)
    def __init__(
        self,
        rid: str,
        origin_input_ids: list[int],
        sampling: SamplingLimits | None = None,
        params: SamplingParams = DEFAULT_PARAMS,
        output_ids: list[int] | None = None,
        seq: int = 0,
        priority: int | None = None,
        kv: array[int] | None = None,
        cached_len: int = 0,
        last_node: RadixNode | None = None,
        prefix_len: int = 0,
        match_node: RadixNode | None = None,
        match_slots: array[int] | None = None,
        fill_len: int = 0,
        extend_input_len: int = 0,
        cached_tokens: int = 0,
        is_retracted: bool = False,
        retraction_count: int = 0,
        finished_reason: FinishReason | None = None,
        abort_requested: bool = False,
        queue_entry: int = 0,
        examined_fill_len: int = 0,
    ) -> None:
        self.rid = rid
        self.origin_input_ids = origin_input_ids
        self.sampling = sampling = SamplingLimits() if sampling is None else sampling
        self.params = params
        self.output_ids = [] if output_ids is None else output_ids
        self.seq = seq
        # the client's priority unless given here (see above)
        self.priority = sampling.priority if priority is None else priority
        # the output budget in force starts as asked
        asked = sampling.requested_max_new_tokens
        self.max_new_tokens = MAX_NEW_TOKENS_UNSET if asked is None else asked
        self.min_new_tokens = sampling.min_new_tokens
        self.stop_token_ids = sampling.stop_token_ids
        self.kv = new_slots() if kv is None else kv
        self.cached_len = cached_len
        self.last_node = last_node
        self.prefix_len = prefix_len
        self.match_node = match_node
        self.match_slots = new_slots() if match_slots is None else match_slots
        self.fill_len = fill_len
        self.extend_input_len = extend_input_len
        self.cached_tokens = cached_tokens
        self.is_retracted = is_retracted
        self.retraction_count = retraction_count
        self.finished_reason = finished_reason
        self.abort_requested = abort_requested
        self.queue_entry = queue_entry
        self.examined_fill_len = examined_fill_len

    def __repr__(self) -> str:
        # Short: a request's prompt and KV can be long, and tracebacks or list.index misses format it.
        return f"Req(rid={self.rid!r}, prompt={len(self.origin_input_ids)}, outputs={len(self.output_ids)})"

    @property
    def seqlen(self) -> int:
        """Prompt plus outputs so far: what a (re-)prefill must cover."""
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def remaining_new_tokens(self) -> int:
        """max_new_tokens (in force) − outputs so far (SGLang does not clamp this at 0 for running
        requests). Hot loops that cannot afford a property call write the expression out and say so."""
        return self.max_new_tokens - len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    def fill_ids(self) -> list[int]:
        """Prompt plus outputs: the token sequence whose KV a (re-)prefill computes."""
        return self.origin_input_ids + self.output_ids

    def reset_for_retract(self) -> None:
        """Forget KV bookkeeping; outputs stay, so a later prefill covers prompt + outputs."""
        self.kv = new_slots()
        self.cached_len = 0
        self.prefix_len = 0
        self.last_node = None
        self.match_node = None
        self.match_slots = new_slots()
        self.fill_len = 0
        self.extend_input_len = 0
        self.is_retracted = True
        self.retraction_count += 1

"""A request as the scheduler sees it: prompt, outputs so far, sampling limits and scheduling state."""

from __future__ import annotations

from array import array  # at run time too: the compiled core's dataclasses evaluate their annotations
from dataclasses import dataclass, field
from enum import Enum

from kvadmit.memory.pool import new_slots
from kvadmit.memory.radix import RadixNode
from kvadmit.sampling_params import SamplingParams

DEFAULT_PARAMS = SamplingParams()


class FinishKind(str, Enum):
    LENGTH = "length"  # reached max_new_tokens
    STOP = "stop"  # EOS, a stop token id or a stop string
    ABORT = "abort"  # aborted by the server (with a message)


@dataclass(frozen=True, slots=True)
class FinishReason:
    kind: FinishKind
    message: str = ""
    status_code: int = 200
    matched: int | str | None = None  # the stop token id or stop string that ended it


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

    # The output budget in force (see above; set by __post_init__, then by the scheduler).
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

    def __repr__(self) -> str:
        # Short: a request's prompt and KV can be long, and tracebacks or list.index misses format it.
        return f"Req(rid={self.rid!r}, prompt={len(self.origin_input_ids)}, outputs={len(self.output_ids)})"

    def __post_init__(self) -> None:
        asked = self.sampling.requested_max_new_tokens
        self.max_new_tokens = MAX_NEW_TOKENS_UNSET if asked is None else asked
        self.min_new_tokens = self.sampling.min_new_tokens
        self.stop_token_ids = self.sampling.stop_token_ids
        if self.priority is None:
            self.priority = self.sampling.priority

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

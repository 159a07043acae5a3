"""What the scheduler hands out and takes back: batches, step outcomes, admission records, and the
messages it ends requests with."""

from __future__ import annotations

from array import array  # at run time too: the compiled core's dataclasses evaluate their annotations
from dataclasses import dataclass, field
from typing import Literal

from kvadmit.request import Req
from kvadmit.scheduler.admission import AddResult, AdmissionPass, Budget
from kvadmit.scheduler.events import PrefillBatchStats

QUEUE_FULL_MESSAGE = "The request queue is full."
UNSCHEDULABLE_MESSAGE = (
    "The request can never be scheduled: even with the KV pool empty it does not pass admission. "
    "Lower max_new_tokens or use a larger pool."
)


@dataclass(slots=True)
class ScheduledBatch:
    """A batch for the executor.

    prefill: for each request, compute tokens fill_ids()[prefix_len:fill_len] into slots
             kv[prefix_len:fill_len], attending to kv[:prefix_len]; sample one token per request.
    decode:  for each request, compute its last output token into slot kv[-1]; sample one token.
    """

    kind: Literal["prefill", "decode"]
    reqs: list[Req]
    chunked: Req | None = None  # in a prefill: the request whose prompt is still unfinished after it
    stats: PrefillBatchStats | None = None
    kv_tokens: int = -1  # in a decode: Σ len(kv) over reqs, as the scheduler keeps it (−1: not given)
    # in a decode: each request's KV slots as scheduled (a request that ends before the batch runs, under
    # the overlap loop, hands its own list to the cache; the batch still computes its last slot)
    kvs: list[array[int]] | None = None
    outs: list[list[int]] | None = None  # in a decode: each request's output list, as scheduled
    # in a prefill under --enable-mixed-chunk: the running requests whose decode rows follow the prefill
    # rows (kvs then holds every row's slots)
    decoding: list[Req] | None = None
    finish_stamp: int = 0  # the scheduler's count of ended requests when it handed the batch out
    graph: bool = False  # the executor ran it from a captured graph (set with its result: "cuda graph: True")

    # Written out (the fields, in order, with their defaults; tests/test_native_inits.py checks): the
    # compiled core builds it natively, where dataclass's generated __init__ is interpreted Python.
    def __init__(
        self,
        kind: Literal["prefill", "decode"],
        reqs: list[Req],
        chunked: Req | None = None,
        stats: PrefillBatchStats | None = None,
        kv_tokens: int = -1,
        kvs: list[array[int]] | None = None,
        outs: list[list[int]] | None = None,
        decoding: list[Req] | None = None,
        finish_stamp: int = 0,
        graph: bool = False,
    ) -> None:
        self.kind = kind
        self.reqs = reqs
        self.chunked = chunked
        self.stats = stats
        self.kv_tokens = kv_tokens
        self.kvs = kvs
        self.outs = outs
        self.decoding = decoding
        self.finish_stamp = finish_stamp
        self.graph = graph


@dataclass(slots=True)
class AdmissionRecord:
    """What one admission pass did, for the batch builder and for `kvadmit capacity` explanations."""

    running_bs: int
    allocatable: int = 0
    gate: str | None = None  # why no candidate was looked at: batch_is_full, no_waiting, request_cap, …
    adder: AdmissionPass | None = None
    looked_at: list[Req] = field(default_factory=list)  # waiting requests passed to add_one_req
    verdict: AddResult | None = None  # the last add_one_req result
    stopped_at: Req | None = None  # the request whose call returned a non-CONTINUE verdict
    stop_cause: str = "end"  # end of queue, a verdict, or the request cap
    budgets: list[Budget] = field(default_factory=list)  # before each looked-at request (explain=True)
    preempted: list[Req] = field(default_factory=list)  # running requests priority preemption took out

    # Written out (the fields, in order, with their defaults; tests/test_native_inits.py checks): the
    # compiled core builds it natively, where dataclass's generated __init__ is interpreted Python.
    # (A list field left out or passed as None starts empty, as its default_factory makes it.)
    def __init__(
        self,
        running_bs: int,
        allocatable: int = 0,
        gate: str | None = None,
        adder: AdmissionPass | None = None,
        looked_at: list[Req] | None = None,
        verdict: AddResult | None = None,
        stopped_at: Req | None = None,
        stop_cause: str = "end",
        budgets: list[Budget] | None = None,
        preempted: list[Req] | None = None,
    ) -> None:
        self.running_bs = running_bs
        self.allocatable = allocatable
        self.gate = gate
        self.adder = adder
        self.looked_at = [] if looked_at is None else looked_at
        self.verdict = verdict
        self.stopped_at = stopped_at
        self.stop_cause = stop_cause
        self.budgets = [] if budgets is None else budgets
        self.preempted = [] if preempted is None else preempted


@dataclass(slots=True)
class StepOutcome:
    """What one step did. Every request of the batch got one token (its `output_ids[-1]`), except a
    prefill's unfinished chunk. `finished` lists every request that ended in the step, client aborts
    included. Aborts also appear as RequestAborted events (for logs and metrics), and aborts outside a
    step (at arrival, queue full, the last request of a retraction) appear only there: a consumer
    answers each request once, when it first hears of its end (the Engine does)."""

    finished: list[Req] = field(default_factory=list)  # requests that ended in this step

    # Written out (the fields, in order, with their defaults; tests/test_native_inits.py checks): the
    # compiled core builds it natively, where dataclass's generated __init__ is interpreted Python.
    def __init__(self, finished: list[Req] | None = None) -> None:
        self.finished = [] if finished is None else finished

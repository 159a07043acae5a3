"""Owed decode slots (scheduler/owed_slots.py) and the anonymous pool they come from (memory/pool.py): a
simulation's decode step records how many members it gave a slot, the requests' KV arrays grow by what
they are owed later, and every array ends up as long as appending at once makes it.

The unit tests use hand-made steps; the runs compare a simulation that defers (the default with no
outside step observer; its pool is anonymous) with one that does not (an outside step observer turns it
off, and its pool names every slot): the same log and step trace, every prefix-cache node holding as many
slots as its key has tokens, and the same number of free slots."""

from __future__ import annotations

import io
from array import array

import pytest

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.executor.base import StepResult
from kvadmit.memory.pool import TokenPool
from kvadmit.memory.radix import RadixNode
from kvadmit.request import Req
from kvadmit.scheduler.batch import RunningBatch
from kvadmit.scheduler.events import Event, Preemption
from kvadmit.scheduler.owed_slots import LIMIT, OwedSlots
from kvadmit.scheduler.types import ScheduledBatch
from kvadmit.sim.run import SimConfig, SimResult, simulate


def _slots(*ids: int) -> array[int]:
    return array("I", ids)


def test_an_anonymous_pool_counts_slots_and_hands_out_zeros() -> None:
    pool = TokenPool(10)
    pool.make_anonymous()
    taken = pool.alloc_extend([], 4)
    assert list(taken) == [0, 0, 0, 0] and pool.available_size() == 6
    assert list(pool.alloc_decode(3)) == [0, 0, 0] and pool.available_size() == 3
    pool.free(taken[:2])
    assert pool.available_size() == 5
    with pytest.raises(Exception, match="asked for 6 pages, 5 free"):
        pool.alloc_decode(6)
    pool.take_count(2)  # a decode step's slots, counted only
    assert pool.available_size() == 3
    with pytest.raises(Exception, match="asked for 4 pages, 3 free"):
        pool.take_count(4)


def test_a_deferring_batch_counts_a_decode_step_it_takes_from_an_anonymous_pool() -> None:
    pool = TokenPool(10)
    pool.make_anonymous()
    reqs = [Req(rid=r, origin_input_ids=[1, 2], kv=pool.alloc_extend([], 2)) for r in "ab"]
    batch = RunningBatch(clip=4096, full_for_ignore_eos=False, reqs=reqs, defer_slots=True)
    batch.take_decode_slots(pool)
    assert pool.available_size() == 4 and batch.kv_tokens == 6
    assert batch.owed is not None and batch.owed.steps == [2]
    batch.settle_all()
    assert [len(r.kv) for r in reqs] == [3, 3]


def test_only_an_unused_pool_of_page_size_1_becomes_anonymous() -> None:
    with pytest.raises(ValueError, match="page size 1"):
        TokenPool(64, page_size=16).make_anonymous()
    used = TokenPool(10)
    used.alloc_decode(1)
    with pytest.raises(ValueError, match="unused pool"):
        used.make_anonymous()


def test_a_member_is_owed_the_steps_taken_since_it_joined() -> None:
    owed = OwedSlots()
    # steps 1 and 2 gave members a, b a slot; c joined (position 2) before step 3
    owed.steps += [2, 2, 3]
    assert [owed.first_step(p) for p in (0, 1, 2)] == [0, 0, 2]
    kv = _slots(7)
    owed.give(kv, 2)
    assert list(kv) == [7, 0]
    kv = _slots()
    owed.give(kv, 1)
    assert list(kv) == [0, 0, 0]


def test_a_member_that_leaves_is_taken_out_of_every_step() -> None:
    owed = OwedSlots()
    owed.steps += [3, 4]  # the member at 3 joined before step 2
    owed.forget(1)
    assert owed.steps == [2, 3]
    owed.forget(2)  # the one that joined last: only step 2 holds it
    assert owed.steps == [2, 2]


def test_give_all_writes_each_block_of_members_its_steps() -> None:
    owed = OwedSlots()
    owed.steps += [2, 3, 4]
    kvs = [_slots(1), _slots(2), _slots(3), _slots(4)]
    owed.give_all(kvs, [])
    assert [list(k) for k in kvs] == [[1, 0, 0, 0], [2, 0, 0, 0], [3, 0, 0], [4, 0]]
    assert owed.steps == [] and owed.done == set()


def test_give_all_skips_members_already_given_their_slots() -> None:
    owed = OwedSlots()
    owed.steps += [3, 3]
    kvs = [_slots(), _slots(), _slots()]
    owed.give(kvs[1], 1)
    owed.done.add(102)  # the member at position 1 (id 102) ended: it has its slots
    owed.give_all(kvs, [101, 102, 103])
    assert list(map(len, kvs)) == [2, 2, 2]


def _config(overlap: bool, variant: str) -> SimConfig:
    args = ServerArgs(
        max_total_tokens={"retract": 8_192, "priority": 8_000}.get(variant, 40_000),
        disable_overlap_schedule=not overlap,
        chunked_prefill_size=256 if variant == "mixed" else None,
        enable_mixed_chunk=variant == "mixed",
        enable_priority_scheduling=variant == "priority",
        priority_scheduling_preemption_threshold=1 if variant == "priority" else 10,
        max_running_requests=16 if variant == "priority" else None,
        schedule_conservativeness=0.3 if variant == "retract" else 1.0,
    )
    retract = variant == "retract"  # (long outputs from short prompts: the running batch outgrows the pool)
    priority = variant == "priority"  # (urgent arrivals into a full pool: running requests are preempted)
    workload = WorkloadSpec(
        num_prompts=200 if retract or priority else 120,
        input_len=128 if retract else 300 if priority else 400,
        output_len=512 if retract else 300 if priority else 3 * LIMIT,  # (outlive LIMIT steps, or not)
        range_ratio=0.5 if retract else 0.0,
        seed=11,
        ignore_eos=False,
        priority_mix=((0, 1.0), (5, 1.0), (10, 1.0)) if priority else None,
    )
    return SimConfig(
        args=args,
        workload=workload,
        cost=CostModel.simple(decode_step_ms=20.0, prefill_tokens_per_s=20_000.0),
        request_rate=8.0 if retract else 40.0,
        warmup_requests=0,
        leaps=False,
    )


def _tree(root: RadixNode) -> list[tuple[int, int]]:
    """Every cache node's key length and slot count, depth first in the children's order."""
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        found.append((len(node.key), len(node.value)))
        stack.extend(reversed(list(node.children.values())))
    return found


def _run(cfg: SimConfig, observe_steps: bool, preempted: list[Event]) -> tuple[SimResult, str]:
    log: list[str] = []
    steps = io.StringIO()

    def watch(batch: ScheduledBatch, result: StepResult, now: float) -> None:
        pass  # an outside step observer: the run writes every slot at once

    def note(event: Event, now: float) -> None:
        if isinstance(event, Preemption):
            preempted.append(event)

    watch_steps = (watch,) if observe_steps else ()
    result = simulate(
        cfg, emit_log=log.append, step_trace=steps, watch_steps=watch_steps, watch_events=(note,)
    )
    return result, "\n".join(log) + steps.getvalue()


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("variant", ["plain", "retract", "mixed", "priority"])
def test_deferred_slots_are_as_many_as_appending_gives(overlap: bool, variant: str) -> None:
    cfg = _config(overlap, variant)
    preempted: list[Event] = []
    deferred, deferred_out = _run(cfg, observe_steps=False, preempted=preempted)
    direct, direct_out = _run(cfg, observe_steps=True, preempted=[])
    assert deferred.scheduler._defer_slots and not direct.scheduler._defer_slots
    assert deferred_out == direct_out
    d, s = deferred.scheduler, direct.scheduler
    assert d.pool.anonymous and not s.pool.anonymous
    assert d.pool.available_size() == s.pool.available_size()
    assert _tree(d.cache.root) == _tree(s.cache.root)
    assert all(key == value for key, value in _tree(d.cache.root)), "a node's slots are not its tokens'"
    assert len(_tree(d.cache.root)) > 10, "the cache kept requests' slots: the comparison is not vacuous"
    if variant == "retract":
        assert deferred.retractions > 0
    if variant == "priority":
        assert preempted, "no running request was preempted: the comparison proves less than it says"


def test_a_member_given_its_slots_when_it_ended_is_not_given_them_again_when_it_leaves() -> None:
    reqs = [Req(rid=r, origin_input_ids=[1, 2, 3], kv=_slots(1, 2, 3)) for r in "abc"]
    batch = RunningBatch(clip=4096, full_for_ignore_eos=False, reqs=reqs, defer_slots=True)
    assert batch.kv_tokens == 9
    pool = TokenPool(100)
    pool.make_anonymous()
    batch.take_decode_slots(pool)
    batch.take_decode_slots(pool)
    assert batch.kv_tokens == 15 and list(reqs[1].kv) == [1, 2, 3]  # owed, not written yet
    ended = reqs[1].kv
    batch.settle(reqs[1])  # b ends: the cache takes its KV and gives it a new, empty array
    assert list(ended) == [1, 2, 3, 0, 0]
    reqs[1].kv = _slots()
    batch.drop_at([1])
    assert list(ended) == [1, 2, 3, 0, 0]
    assert batch.kv_tokens == 10  # 15 less b's 5
    batch.settle_all()
    assert [list(r.kv) for r in (reqs[0], reqs[2])] == [[1, 2, 3, 0, 0], [1, 2, 3, 0, 0]]
    assert batch.kv_tokens == sum(map(len, batch.kvs))


def test_owed_steps_are_written_out_at_the_limit() -> None:
    reqs = [Req(rid="a", origin_input_ids=[1], kv=_slots(7))]
    batch = RunningBatch(clip=4096, full_for_ignore_eos=False, reqs=reqs, defer_slots=True)
    pool = TokenPool(100)
    pool.make_anonymous()
    for _ in range(1, LIMIT):
        batch.take_decode_slots(pool)
    assert len(reqs[0].kv) == 1
    batch.take_decode_slots(pool)
    assert list(reqs[0].kv) == [7] + [0] * LIMIT

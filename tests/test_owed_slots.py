"""Owed decode slots (scheduler/owed_slots.py): a decode step's slots are written into the requests' KV
arrays later, and every array ends up holding the same slot ids in the same order as appending at once.

The unit tests use hand-made steps (slot ids chosen so that each says which step and position it came
from); the runs compare a simulation that defers (the default with no outside step observer) with one
that does not (an outside step observer turns it off), slot id by slot id: every request's KV at its end,
the prefix cache's nodes and the pool's free list."""

from __future__ import annotations

import io
from array import array

import pytest

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.executor.base import StepResult
from kvadmit.memory.radix import RadixNode
from kvadmit.request import Req
from kvadmit.scheduler.batch import RunningBatch
from kvadmit.scheduler.events import Event, Preemption
from kvadmit.scheduler.owed_slots import LIMIT, OwedSlots
from kvadmit.scheduler.types import ScheduledBatch
from kvadmit.sim.run import SimConfig, SimResult, simulate


def _slots(*ids: int) -> array[int]:
    return array("I", ids)


def test_a_member_is_owed_the_steps_taken_since_it_joined() -> None:
    owed = OwedSlots()
    # steps 1 and 2 with members a, b; c joins (position 2) before step 3; step s gives slot 10·s + position
    owed.steps += [_slots(10, 11), _slots(20, 21), _slots(30, 31, 32)]
    assert [owed.first_step(p) for p in (0, 1, 2)] == [0, 0, 2]
    kv = _slots(7)
    owed.give(kv, 2)
    assert list(kv) == [7, 32]
    kv = _slots()
    owed.give(kv, 1)
    assert list(kv) == [11, 21, 31]


def test_a_member_that_leaves_is_taken_out_of_every_step() -> None:
    owed = OwedSlots()
    owed.steps += [_slots(10, 11, 12), _slots(20, 21, 22, 23)]  # the member at 3 joined before step 2
    owed.forget(1)
    assert [list(s) for s in owed.steps] == [[10, 12], [20, 22, 23]]
    owed.forget(2)  # the one that joined last: only step 2 holds it
    assert [list(s) for s in owed.steps] == [[10, 12], [20, 22]]


def test_give_all_writes_each_block_of_members_in_step_order() -> None:
    owed = OwedSlots()
    owed.steps += [_slots(10, 11), _slots(20, 21, 22), _slots(30, 31, 32, 33)]
    kvs = [_slots(1), _slots(2), _slots(3), _slots(4)]
    owed.give_all(kvs, [])
    assert [list(k) for k in kvs] == [[1, 10, 20, 30], [2, 11, 21, 31], [3, 22, 32], [4, 33]]
    assert owed.steps == [] and owed.done == set()


def test_give_all_skips_members_already_given_their_slots() -> None:
    owed = OwedSlots()
    owed.steps += [_slots(10, 11, 12), _slots(20, 21, 22)]
    kvs = [_slots(), _slots(), _slots()]
    owed.give(kvs[1], 1)
    owed.done.add(102)  # the member at position 1 (id 102) ended: it has its slots
    owed.give_all(kvs, [101, 102, 103])
    assert [list(k) for k in kvs] == [[10, 20], [11, 21], [12, 22]]


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


def _tree(root: RadixNode) -> list[tuple[int, bytes]]:
    """Every cache node's key length and slot ids, depth first in the children's order."""
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        found.append((len(node.key), node.value.tobytes()))
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
def test_deferred_slots_are_the_slots_appending_gives(overlap: bool, variant: str) -> None:
    cfg = _config(overlap, variant)
    preempted: list[Event] = []
    deferred, deferred_out = _run(cfg, observe_steps=False, preempted=preempted)
    direct, direct_out = _run(cfg, observe_steps=True, preempted=[])
    assert deferred.scheduler._defer_slots and not direct.scheduler._defer_slots
    assert deferred_out == direct_out
    d, s = deferred.scheduler, direct.scheduler
    assert (d.pool._fresh, d.pool._returned.tobytes()) == (s.pool._fresh, s.pool._returned.tobytes())
    assert _tree(d.cache.root) == _tree(s.cache.root)
    assert len(_tree(d.cache.root)) > 10, "the cache kept requests' slots: the comparison is not vacuous"
    if variant == "retract":
        assert deferred.retractions > 0
    if variant == "priority":
        assert preempted, "no running request was preempted: the comparison proves less than it says"


def test_a_member_given_its_slots_when_it_ended_is_not_given_them_again_when_it_leaves() -> None:
    reqs = [Req(rid=r, origin_input_ids=[1, 2, 3], kv=_slots(1, 2, 3)) for r in "abc"]
    batch = RunningBatch(clip=4096, full_for_ignore_eos=False, reqs=reqs, defer_slots=True)
    assert batch.kv_tokens == 9
    batch.give_decode_slots(_slots(10, 11, 12))
    batch.give_decode_slots(_slots(20, 21, 22))
    assert batch.kv_tokens == 15 and list(reqs[1].kv) == [1, 2, 3]  # owed, not written yet
    ended = reqs[1].kv
    batch.settle(reqs[1])  # b ends: the cache takes its KV and gives it a new, empty array
    assert list(ended) == [1, 2, 3, 11, 21]
    reqs[1].kv = _slots()
    batch.drop_at([1])
    assert list(ended) == [1, 2, 3, 11, 21]
    assert batch.kv_tokens == 10  # 15 less b's 5
    batch.settle_all()
    assert [list(r.kv) for r in (reqs[0], reqs[2])] == [[1, 2, 3, 10, 20], [1, 2, 3, 12, 22]]
    assert batch.kv_tokens == sum(map(len, batch.kvs))


def test_owed_steps_are_written_out_at_the_limit() -> None:
    reqs = [Req(rid="a", origin_input_ids=[1], kv=_slots(0))]
    batch = RunningBatch(clip=4096, full_for_ignore_eos=False, reqs=reqs, defer_slots=True)
    for step in range(1, LIMIT):
        batch.give_decode_slots(_slots(step))
    assert len(reqs[0].kv) == 1
    batch.give_decode_slots(_slots(LIMIT))
    assert list(reqs[0].kv) == list(range(LIMIT + 1))

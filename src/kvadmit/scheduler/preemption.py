"""Priority preemption (docs/sglang-rules.md §13.4): when the request cap stops admission, an arriving
request that is more urgent than running ones by more than --priority-scheduling-preemption-threshold
takes their place. A mixin of Scheduler, like DecodeMemory; the state it reads belongs to Scheduler.

The preempted requests are released as a retraction releases its victims (KV freed without caching, the
cache evicted down to `retract_decode_steps` tokens per request still in the batch, the request reset),
leave the running batch, and re-enter the waiting queue after the pass, through the queue cap."""

from __future__ import annotations

from kvadmit.config import SchedulerKnobs
from kvadmit.memory.pool import TokenPool
from kvadmit.memory.radix import RadixCache
from kvadmit.request import Req
from kvadmit.scheduler.admission import AdmissionPass
from kvadmit.scheduler.batch import RunningBatch
from kvadmit.scheduler.events import Event, Preemption
from kvadmit.scheduler.priority import PriorityScheduling, tokens_to_free
from kvadmit.scheduler.retraction import evict_for
from kvadmit.scheduler.traits import trait


@trait
class PriorityPreemption:
    running: RunningBatch
    cache: RadixCache
    pool: TokenPool
    knobs: SchedulerKnobs
    prio: PriorityScheduling
    events: list[Event]
    _finished_positions: list[int]
    _left_in_pass: list[Req]

    def _release(self, req: Req) -> None:  # DecodeMemory's, earlier in the MRO
        raise NotImplementedError

    def _enqueue(self, req: Req, front: bool = False) -> bool:  # RequestIntake's, earlier in the MRO
        raise NotImplementedError

    def preempt_for(self, candidate: Req, adder: AdmissionPass, preempted: list[Req]) -> bool:
        """SGLang's PrefillAdder.preempt_to_schedule: True if running requests were preempted so that
        `candidate` may be tried (it is prepared and tried after this, and may still not fit). The
        preempted requests are appended to `preempted`, to be re-queued after the pass."""
        if not self.prio.may_preempt(candidate, self.running.reqs, self.running.priority_counts):
            return False
        short = tokens_to_free(candidate, adder.rem_total_tokens, adder.clip)
        chosen = self.prio.choose_preempted(candidate, self.running.reqs, short, adder.running_offset)
        if chosen is None:
            return False
        gone = set(map(id, chosen))
        victims = [r for r in self.running.reqs if id(r) in gone]  # batch order, as SGLang releases them
        adder.release_running(victims)
        size = len(self.running.reqs)
        for n, req in enumerate(victims, start=1):
            self._release(req)
            evict_for(self.cache, self.pool, (size - n) * self.knobs.retract_decode_steps)
            req.reset_for_retract()
        kept = [r for r in self.running.reqs if id(r) not in gone]
        self.running.replace(kept)
        # requests that ended in the last decode step are still in the batch; their positions moved
        self._finished_positions = [i for i, r in enumerate(kept) if r.finished]
        preempted.extend(chosen)
        self._left_in_pass += victims  # (overlap loop: their token from the step in flight is dropped)
        self.events.append(Preemption(rids=tuple(r.rid for r in chosen), by_rid=candidate.rid))
        return True

    def requeue_preempted(self, preempted: list[Req]) -> None:
        """After the pass: the preempted requests wait again (SGLang re-adds them in set order, which
        depends on object addresses; we take the order they were chosen in, least urgent first)."""
        for req in preempted:
            self._enqueue(req)

"""--enable-mixed-chunk (docs/sglang-rules.md A.5): when a prefill batch forms and requests are running,
their decode step rides in it. A mixin of Scheduler, like DecodeMemory; the state it reads belongs to it.

SGLang's `get_new_batch_prefill`, after the prefill batch is built: under the overlap loop the running
requests the batch in flight finishes by length leave first (and the batch is no longer full); if the rest
get a slot each (`check_decode_mem`, evicting as needed) they are prepared for decode and appended to the
prefill batch as decode rows, and the running batch starts empty (its batch_is_full kept): the next
pass merges them back after the prefill's requests. If they do not fit, they sit out this step (no
retraction) and decode at the next decode pass. The admission pass that built the batch already took
one token per running request from its input and chunk budgets (AdmissionPass's mixed_decode_tokens).
No ratio decay: a mixed step is not an update of the running batch.
"""

from __future__ import annotations

from kvadmit.memory.pool import TokenPool
from kvadmit.memory.radix import RadixCache
from kvadmit.request import Req
from kvadmit.scheduler.batch import RunningBatch
from kvadmit.scheduler.retraction import check_decode_mem
from kvadmit.scheduler.traits import trait
from kvadmit.scheduler.types import ScheduledBatch


@trait
class MixedChunk:
    running: RunningBatch
    cache: RadixCache
    pool: TokenPool
    page_size: int
    mixed_chunk: bool

    # Methods of the Scheduler and its other mixins that this one calls. The stubs never run: each name is
    # found earlier in the Scheduler's MRO. (Declared as methods, not Callable attributes, so the compiled
    # core's trait calls the real method; kvadmit/native.py.)
    def _drop_finished(self) -> bool:  # Scheduler's, earlier in the MRO
        raise NotImplementedError

    def drop_finishing_in_flight(self) -> list[Req]:  # DecodeMemory's, earlier in the MRO
        raise NotImplementedError

    def alloc_decode_slots(self) -> None:  # DecodeMemory's, earlier in the MRO
        raise NotImplementedError

    def _new_running_batch(self, reqs: list[Req] | None = None) -> RunningBatch:  # Scheduler's
        raise NotImplementedError

    def mix_running(self, batch: ScheduledBatch) -> ScheduledBatch:
        """`batch` (a new prefill batch) with the running requests' decode rows, if they fit."""
        running = self.running
        if not running.reqs:
            return batch
        self._drop_finished()  # SGLang's filter_batch drops them here too (batch_is_full stays as it is)
        if self.drop_finishing_in_flight():
            running.batch_is_full = False
        if not running.reqs or not check_decode_mem(running.reqs, self.cache, self.pool, self.page_size):
            return batch
        self.alloc_decode_slots()
        running.settle_all()  # the batch hands its members' KV arrays on
        decoding = list(running.reqs)
        kvs = [r.kv for r in batch.reqs] + list(running.kvs)
        self.running = self._new_running_batch()
        self.running.batch_is_full = running.batch_is_full
        return ScheduledBatch(
            kind="prefill",
            reqs=batch.reqs + decoding,
            chunked=batch.chunked,
            stats=batch.stats,
            kvs=kvs,
            decoding=decoding,
        )

"""SGLang's overlap loop (docs/sglang-rules.md A.1): the next pass is scheduled before the last batch's
result is processed. Expected values are the rules' arithmetic, by hand."""

from __future__ import annotations

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.engine import Engine, VirtualClock
from kvadmit.executor.base import StepResult
from kvadmit.request import FinishKind, Req, SamplingLimits
from kvadmit.scheduler.scheduler import ScheduledBatch, Scheduler
from kvadmit.sim.run import SimConfig, simulate

TEXT, EOS = 7, 2


def _req(rid: str, prompt: int, max_new: int) -> Req:
    return Req(rid, list(range(100, 100 + prompt)), SamplingLimits(requested_max_new_tokens=max_new))


def _tokens(batch: ScheduledBatch) -> list[int]:
    return [TEXT] * len(batch.reqs)


def test_the_pass_after_a_prefill_sees_no_output_yet_but_allocates_the_next_slot() -> None:
    sched = Scheduler(ServerArgs(max_total_tokens=200), eos_token_ids=frozenset({EOS}))
    r = _req("r", prompt=10, max_new=5)
    sched.add_request(r)
    prefill = sched.next_batch()
    assert prefill is not None and prefill.kind == "prefill"
    d1 = sched.next_batch()  # scheduled while the prefill's result is in flight: r already decodes
    assert d1 is not None and d1.reqs == [r]
    assert r.output_ids == [] and len(r.kv) == 11  # its output lags; its KV does not (prompt + 1 slot)
    # its reservation in that pass counts the lagging output: min(5 − 0, 4096) = 5 tokens × ratio
    assert sched.running.exact_reservation(1.0) == 5
    sched.on_batch_done(prefill, _tokens(prefill))
    assert r.output_ids == [TEXT] and sched.running.exact_reservation(1.0) == 4  # the sums follow
    d2 = sched.next_batch()
    assert d2 is not None and d2.reqs == [r] and r.output_ids == [TEXT] and len(r.kv) == 12
    sched.on_batch_done(d1, _tokens(d1))
    assert r.output_ids == [TEXT, TEXT]


def test_a_request_finishing_by_length_in_flight_gets_no_slot_and_leaves_the_batch() -> None:
    sched = Scheduler(ServerArgs(max_total_tokens=200), eos_token_ids=frozenset({EOS}))
    a, b = _req("a", prompt=10, max_new=2), _req("b", prompt=10, max_new=9)
    sched.add_request(a)
    sched.add_request(b)
    prefill = sched.next_batch()
    assert prefill is not None and prefill.reqs == [a, b]
    sched.on_batch_done(prefill, _tokens(prefill))  # one output each
    d1 = sched.next_batch()
    assert d1 is not None and d1.reqs == [a, b]
    # d1 in flight: a has 1 output (2 after d1), max_new 2: len(out) + 1 >= 2, so it finishes by length
    d2 = sched.next_batch()
    assert d2 is not None and d2.reqs == [b] and len(a.kv) == 11  # no third slot for a
    outcome = sched.on_batch_done(d1, _tokens(d1))
    assert [r.rid for r in outcome.finished] == ["a"] and a.finished_reason.kind is FinishKind.LENGTH
    sched.on_batch_done(d2, _tokens(d2))
    assert b.output_ids == [TEXT] * 3
    sched.check_invariants()


def test_a_request_stopping_on_eos_in_flight_keeps_its_slot_in_the_next_batch() -> None:
    # EOS cannot be foreseen: the next decode batch still holds the request (and a slot for it); the
    # finished request's KV, that extra slot included, goes to the prefix cache when it ends.
    sched = Scheduler(ServerArgs(max_total_tokens=200), eos_token_ids=frozenset({EOS}))
    a, b = _req("a", prompt=10, max_new=50), _req("b", prompt=10, max_new=50)
    sched.add_request(a)
    sched.add_request(b)
    prefill = sched.next_batch()
    assert prefill is not None
    sched.on_batch_done(prefill, _tokens(prefill))
    d1 = sched.next_batch()
    d2 = sched.next_batch()
    assert d1 is not None and d2 is not None and d2.reqs == [a, b]
    outcome = sched.on_batch_done(d1, [EOS, TEXT])
    assert [r.rid for r in outcome.finished] == ["a"]
    d3 = sched.next_batch()  # d2 in flight: a has ended and leaves the batch
    assert d3 is not None and d3.reqs == [b]
    outcome = sched.on_batch_done(d2, [TEXT, TEXT])  # a's token in d2 is dropped: it had ended
    assert outcome.finished == [] and a.output_ids == [TEXT, EOS] and b.output_ids == [TEXT] * 3
    sched.check_invariants()


class _Script:
    """A stub executor: every token TEXT, each step costs 10 ms."""

    def run(self, batch: ScheduledBatch) -> StepResult:
        return StepResult(_tokens(batch), 0.010)


class _Listener:
    def __init__(self) -> None:
        self.finished: list[tuple[str, float]] = []

    def on_step(self, batch: ScheduledBatch, now: float) -> None:
        pass

    def on_finish(self, req: Req, now: float) -> None:
        self.finished.append((req.rid, now))


def test_the_overlap_engine_takes_the_same_time_per_step_and_processes_each_batch_once() -> None:
    # One request, 3 outputs: prefill (token 1), decode (2), decode (3). Each step costs 10 ms, and the
    # scheduler's own work is hidden: the last token is out at 30 ms, as in the non-overlap loop.
    for overlap in (False, True):
        sched = Scheduler(ServerArgs(max_total_tokens=200, disable_overlap_schedule=not overlap))
        listener = _Listener()
        engine = Engine(sched, _Script(), VirtualClock(), listener)
        engine.submit(_req("r", prompt=10, max_new=3))
        while engine.step():
            pass
        [(rid, at)] = listener.finished
        assert rid == "r" and abs(at - 0.030) < 1e-12, (overlap, at)
        assert engine.launched == 3 and not engine.busy


def test_random_overlap_runs_keep_the_pool_accounting_and_end_every_request_once() -> None:
    # A small pool, early stops and chunked prefill: retractions, skips and EOS finishers in flight.
    retractions = 0
    for seed in range(6):
        cfg = SimConfig(
            args=ServerArgs(max_total_tokens=3000, chunked_prefill_size=256, random_seed=seed),
            workload=WorkloadSpec(num_prompts=120, input_len=200, output_len=300, range_ratio=0.9,
                                  ignore_eos=False, seed=seed),
            cost=CostModel.simple(decode_step_ms=10, prefill_tokens_per_s=20_000),
            max_concurrency=64,
        )  # fmt: skip
        result = simulate(cfg)
        result.scheduler.check_invariants()
        assert len(result.outcomes) == 120 and all(o.success for o in result.outcomes)
        assert (
            result.scheduler.is_fully_idle()
            and result.scheduler.pool.available_size() + (result.scheduler.cache.evictable_size()) == 3000
        )
        retractions += result.retractions
    assert retractions > 0  # the runs were under pressure


def test_decode_is_skipped_not_retracted_when_a_request_finishing_in_flight_will_free_the_pool() -> None:
    """Pool 100, page 1, no prefix cache. A (10 + 41) prefills; B (10 + 45) is admitted in the next pass,
    with A's 41 remaining tokens (its output lags) reserved at 0.7: 10 + 45 + 1 = 56 < 90 − 28.7 = 61.3.
    Both prefilled, 80 slots are free and each decode pass takes 2: passes 0–39 leave 78, 76, …, 0. At
    pass 40, decode 39 in flight gives A its 41st and last token (40 outputs + 1 ≥ 41): A leaves the batch
    and B alone still finds no slot, so decode is skipped: no retraction, no decay. Once decode 39's result
    frees A's 50 slots, B decodes."""
    sched = Scheduler(
        ServerArgs(max_total_tokens=100, disable_radix_cache=True), eos_token_ids=frozenset({EOS})
    )
    a, b = _req("a", prompt=10, max_new=41), _req("b", prompt=10, max_new=45)
    sched.add_request(a)
    in_flight = sched.next_batch()
    assert in_flight is not None and in_flight.reqs == [a]
    sched.add_request(b)
    passes: list[ScheduledBatch | None] = []
    while True:
        nxt = sched.next_batch()
        passes.append(nxt)
        if nxt is None:
            break
        sched.on_batch_done(in_flight, _tokens(in_flight))
        in_flight = nxt
    # the prefill of B, then decode passes 0–39, then the skipped pass
    assert [p.kind for p in passes[:-1]] == ["prefill"] + ["decode"] * 40  # type: ignore[union-attr]
    assert sched.pool.available_size() == 0 and a.output_ids == [TEXT] * 40
    assert sched.running.reqs == [b] and not sched.running.batch_is_full
    ratio = sched.ratio.current
    assert not [e for e in sched.drain_events() if type(e).__name__ == "Retraction"]
    outcome = sched.on_batch_done(in_flight, _tokens(in_flight))
    assert [r.rid for r in outcome.finished] == ["a"] and sched.pool.available_size() == 50
    after = sched.next_batch()
    assert after is not None and after.reqs == [b] and sched.ratio.current < ratio  # decays again

"""Answers for a snapshot: which waiting requests are admitted and why the rest wait, or, for a decode
check, which running requests are retracted. Field names are docs/architecture.md's, so answers compare
mechanically with SGLang's own decisions."""

from __future__ import annotations

from typing import Any

from kvadmit.capacity.snapshot import Snapshot, build_scheduler
from kvadmit.request import Req
from kvadmit.scheduler.admission import AddResult, Budget
from kvadmit.scheduler.decode_memory import DECODE_SKIPPED
from kvadmit.scheduler.events import Preemption
from kvadmit.scheduler.retraction import decode_tokens_needed
from kvadmit.scheduler.scheduler import AdmissionRecord, EngineCrash, Scheduler


def answer(snap: Snapshot) -> dict[str, Any]:
    return answer_decode(snap) if snap.check == "decode" else answer_admission(snap)


def _n(x: float) -> str:
    """A token count for a sentence: thousands separators, decimals only when there are some."""
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.2f}"
    return f"{int(x):,}"


def answer_admission(snap: Snapshot) -> dict[str, Any]:
    sched = build_scheduler(snap)
    record = sched.run_admission(explain=True)
    adder = record.adder if record.adder is not None else sched._new_admission_pass()
    verdict = record.verdict if record.verdict is not None else adder.budget_state()
    final = adder.snapshot_budget()
    return {
        "admitted": [r.rid for r in adder.can_run_list],
        "chunked": adder.new_chunked_req.rid if adder.new_chunked_req is not None else None,
        "extend_lens": {r.rid: r.extend_input_len for r in adder.can_run_list},
        "prefix_lens": {r.rid: r.prefix_len for r in record.looked_at},
        "verdict": verdict.value,
        "stopped_at": record.stopped_at.rid if record.stopped_at is not None else None,
        "preempted": [r.rid for r in record.preempted],
        "rem_total_tokens": final.rem_total_tokens,
        "cur_rem_tokens": final.cur_rem_tokens,
        "rem_input_tokens": final.rem_input_tokens,
        "rem_chunk_tokens": final.rem_chunk_tokens,
        "explanation": _explain_admission(sched, record, final) + _explain_in_flight(sched, snap),
    }


def _explain_in_flight(sched: Scheduler, snap: Snapshot, eos_only: bool = False) -> list[str]:
    """Under the overlap loop: what the requests of the step in flight still hold in this pass."""
    batch = sched.in_flight
    if batch is None:
        return []
    stops = {r.rid for r in snap.running if r.stops_in_flight}
    out = []
    for r in batch.reqs:
        ends = "by length" if r.max_new_tokens - len(r.output_ids) <= 1 and not eos_only else None
        if ends is None and r.rid in stops:
            ends = "on EOS (SGLang cannot foresee it)"
        if ends is not None:
            out.append(
                f"{r.rid} finishes {ends} in the step in flight: its {_n(len(r.kv))} tokens and its "
                f"reservation are released after this pass"
            )
    return out


def _need(sched: Scheduler, req: Req) -> tuple[int, int, int]:
    """(tokens the fit test needs, uncached tokens, output tokens counted) for a prepared request."""
    clip = sched.knobs.clip_max_new_tokens_estimation
    max_new = min(max(req.remaining_new_tokens, 0), clip)
    page = sched.page_size if sched.profile.page_size_in_fit_check else 0
    return req.extend_input_len + max_new + page, req.extend_input_len, max_new


def _held_back(sched: Scheduler, budget: Budget) -> str:
    parts = []
    if sched.running.reqs:
        eos = ", ignore_eos requests at 1.0" if sched.profile.ignore_eos_reserves_in_full else ""
        parts.append(
            f"the running requests' reservation of {_n(budget.running_reservation)} "
            f"(ratio {sched.ratio.current:.4f}{eos})"
        )
    if budget.charged:
        parts.append(f"{_n(budget.charged)} charged to requests admitted before it")
    return " and ".join(parts) if parts else "nothing held back"


def _explain_admission(sched: Scheduler, record: AdmissionRecord, final: Budget) -> list[str]:
    sentences: list[str] = _explain_preemption(sched, record)
    if record.gate == "request_cap":
        cap = sched.max_running_requests
        return [
            f"{r.rid}: waits: {record.running_bs} running requests already fill max_running_requests={cap}"
            for r in sched.waiting
        ]
    admitted = {id(r) for r in (record.adder.can_run_list if record.adder else [])}
    chunked = record.adder.new_chunked_req if record.adder else None
    looked = {id(r): i for i, r in enumerate(record.looked_at)}
    stop = record.stopped_at
    for req in sched.waiting:
        i = looked.get(id(req))
        if i is None:
            if record.stop_cause == "request_cap":
                why = (
                    f"not considered: {record.running_bs} running + {len(admitted)} admitted reach the "
                    f"request limit ({record.allocatable} could be added)"
                )
            elif stop is not None:
                why = f"not considered: admission stops at the first request that cannot go ({stop.rid})"
            else:
                why = "not considered"
            sentences.append(f"{req.rid}: {why}")
            continue
        budget = record.budgets[i]
        total, extend, max_new = _need(sched, req)
        page_part = f" + {sched.page_size} page" if sched.profile.page_size_in_fit_check else ""
        need = f"needs {_n(total)} tokens ({_n(extend)} uncached prompt + {_n(max_new)} output{page_part})"
        # Locking its own cached prefix takes those tokens out of the evictable count.
        remain = budget.rem_total_tokens - req.prefix_len
        if id(req) in admitted:
            kind = (
                f"admitted as a first chunk of {_n(req.extend_input_len)} tokens (it reserves its output "
                "with its last chunk)"
                if req is chunked
                else "admitted"
            )
            sentences.append(
                f"{req.rid}: {kind}: {need}, {_n(remain)} remained after {_held_back(sched, budget)}"
            )
            if req is stop and record.verdict is AddResult.NO_TOKEN:
                sentences[-1] += "; that used up the budget, so admission stops here"
            elif req is stop and record.verdict is AddResult.OTHER:
                sentences[-1] += "; that used up the prefill token or chunk budget, so admission stops here"
            continue
        if record.verdict is AddResult.NO_TOKEN:
            if req.sampling.ignore_eos and not sched.cache.enabled:
                why = (
                    f"waits: with the prefix cache disabled an ignore_eos request must fit its prompt now "
                    f"and leave every request room to finish; {_n(budget.cur_rem_tokens)} free tokens are "
                    "not enough"
                )
            else:
                why = f"waits: {need}, only {_n(remain)} remain after {_held_back(sched, budget)}"
        elif sched.args.prefill_max_requests is not None and len(admitted) >= sched.args.prefill_max_requests:
            why = f"waits: --prefill-max-requests {sched.args.prefill_max_requests} reached this pass"
        else:
            why = (
                f"waits: its {_n(extend)} uncached tokens exceed the prefill budget left this pass "
                f"({_n(budget.rem_input_tokens)} of --max-prefill-tokens {sched.args.max_prefill_tokens:,})"
            )
        sentences.append(f"{req.rid}: {why}")
    return sentences


def _explain_preemption(sched: Scheduler, record: AdmissionRecord) -> list[str]:
    """A sentence per running request that priority preemption took out of the batch, naming who for."""
    if not record.preempted:
        return []
    by = {}
    for event in sched.events:
        if isinstance(event, Preemption):
            by.update(dict.fromkeys(event.rids, event.by_rid))
    prio = {r.rid: r.priority for r in [*record.looked_at, *record.preempted]}
    threshold = sched.prio.preemption_threshold
    return [
        f"{r.rid}: preempted for {by[r.rid]} (priority {prio[by[r.rid]]} against {r.priority}: more urgent "
        f"by more than --priority-scheduling-preemption-threshold {threshold}, with the request cap "
        f"reached): its {_n(r.seqlen)} tokens of KV are freed and it waits again, to be recomputed"
        for r in record.preempted
    ]


def _no_retraction(
    called: bool, kept: list[str], explanation: list[str], message: str | None = None
) -> dict[str, Any]:
    """A decode answer in which nobody is retracted (a crash of an old release, or a skipped decode)."""
    return {
        "retract_called": called,
        "retracted": [],
        "aborted": None,
        "abort_message": message,
        "new_ratio": None,
        "kept": kept,
        "new_tokens_gained": 0,
        "explanation": explanation,
    }


def answer_decode(snap: Snapshot) -> dict[str, Any]:
    sched = build_scheduler(snap)
    before = list(sched.running.reqs)
    old_ratio = sched.ratio.current
    needed = decode_tokens_needed(before, sched.page_size)
    free, evictable = sched.pool.available_size(), sched.cache.evictable_size()
    finishing = sched.drop_finishing_in_flight()
    try:
        event = sched.check_decode_or_retract(finishing_in_flight=bool(finishing))
    except EngineCrash as crash:
        return _no_retraction(True, [], [f"SGLang {sched.profile.name} crashes here: {crash}"], str(crash))
    explanation = [
        f"the next decode step needs {_n(needed)} slots; {_n(free)} are free and {_n(evictable)} evictable"
    ]
    for r in finishing:
        explanation.append(
            f"{r.rid} finishes by length in the step in flight: it leaves the batch and needs no slot; its "
            f"{_n(len(r.kv))} tokens are released after this pass"
        )
    if event is DECODE_SKIPPED:
        explanation.append(
            "the rest still do not fit, but the step in flight will free the finishing requests' KV: decode "
            "is skipped this pass (no retraction, no decay; SGLang's overlap loop)"
        )
        explanation += _explain_in_flight(sched, snap, eos_only=True)
        return {**_no_retraction(False, [r.rid for r in sched.running.reqs], explanation), "skipped": True}
    explanation += _explain_in_flight(sched, snap, eos_only=True)
    assert not isinstance(event, type(DECODE_SKIPPED))
    result = sched.last_retract_result if event is not None else None
    last = result.last_request if result is not None else None
    if event is None:
        explanation.append("they fit: no retraction, and the ratio decays by one step")
    else:
        assert result is not None
        kept = result.kept
        by_priority = sched.prio.retract_by_priority
        rule = "(fewest outputs go first, then the longest prompt)"
        if by_priority:
            rule = (
                "(--retraction-policy priority: the least urgent go first, then fewest outputs, then the "
                "longest prompt)"
            )
        for r in result.retracted:
            prio = f"priority {r.priority}, " if by_priority else ""
            explanation.append(
                f"retracted {r.rid}: {prio}{len(r.output_ids)} outputs, prompt {len(r.origin_input_ids)} "
                + rule
            )
        if last is not None:
            explanation.append(f"{last.rid} alone still does not fit: aborted")
        outs = sum(len(r.output_ids) for r in kept)
        maxnew = sum(r.max_new_tokens for r in kept)
        steps = sched.knobs.retract_decode_steps
        explanation.append(
            f"new ratio = min(1, (Σ outputs {_n(outs)} + {steps} × {len(kept)}) / (Σ max_new_tokens "
            f"{_n(maxnew)} + 1)) = {outs + steps * len(kept)}/{maxnew + 1} = {event.new_ratio:.6f} "
            f"(was {old_ratio:.4f})"
        )
    return {
        "retract_called": event is not None,
        "retracted": [r.rid for r in result.retracted] if result else [],
        "aborted": last.rid if last is not None else None,
        "abort_message": last.finished_reason.message if last and last.finished_reason else None,
        "new_ratio": event.new_ratio if event is not None else None,
        "kept": [r.rid for r in sched.running.reqs],
        "new_tokens_gained": event.new_tokens_gained if event is not None else 0,
        "explanation": explanation,
    }

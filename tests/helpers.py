"""Test helpers: tiny schedulers and requests built from the rules' own numbers."""

from __future__ import annotations

import itertools
from typing import Any

from kvadmit.capacity.answer import answer_admission
from kvadmit.capacity.snapshot import parse_snapshot
from kvadmit.config import ServerArgs
from kvadmit.memory.pool import TokenPool
from kvadmit.memory.radix import RadixCache
from kvadmit.request import Req, SamplingLimits
from kvadmit.scheduler.scheduler import Scheduler

_ids = itertools.count(1_000_000)


def make_req(
    rid: str,
    prompt_len: int = 0,
    max_new_tokens: int = 128,
    ignore_eos: bool = False,
    prompt: list[int] | None = None,
) -> Req:
    """A request with its own token ids (so no accidental shared prefix) unless `prompt` is given."""
    tokens = prompt if prompt is not None else [next(_ids) for _ in range(prompt_len)]
    return Req(rid=rid, origin_input_ids=tokens, sampling=SamplingLimits(max_new_tokens, ignore_eos))


def make_scheduler(**kw: object) -> Scheduler:
    context_len = kw.pop("context_len", None)
    return Scheduler(ServerArgs(**kw), context_len=context_len)  # type: ignore[arg-type]


def step(sched: Scheduler, token: int = 7) -> tuple[object, object]:
    """One pass + one result with every request sampling `token`."""
    batch = sched.next_batch()
    if batch is None:
        return None, None
    out = sched.on_batch_done(batch, [token] * len(batch.reqs))
    sched.check_invariants()
    return batch, out


def drain(sched: Scheduler, max_steps: int = 100_000) -> list[object]:
    """Run until nothing is left to do; return every event the scheduler emitted."""
    events: list[object] = []
    for _ in range(max_steps):
        batch, _ = step(sched)
        events.extend(sched.drain_events())
        if batch is None:
            return events
    raise AssertionError(f"still busy after {max_steps} steps")


def admit(server: dict[str, Any], waiting: list[dict[str, Any]], **rest: Any) -> dict[str, Any]:
    """Answer an admission snapshot (chunked prefill 8192 unless the server says otherwise)."""
    snap = {"server": {"chunked_prefill_size": 8192, **server}, "waiting": waiting, **rest}
    return answer_admission(parse_snapshot(snap))


def w(rid: str, prompt: int, max_new: int, **kw: Any) -> dict[str, Any]:
    """A waiting request of a snapshot."""
    return {"rid": rid, "prompt_len": prompt, "max_new_tokens": max_new, **kw}


def r(rid: str, prompt: int, out: int, max_new: int, ignore_eos: bool = False) -> dict[str, Any]:
    """A running request of a snapshot."""
    return {
        "rid": rid,
        "prompt_len": prompt,
        "output_len": out,
        "max_new_tokens": max_new,
        "ignore_eos": ignore_eos,
    }


def cache_with(prompts: list[list[int]]) -> RadixCache:
    """A prefix cache holding these prompts."""
    pool = TokenPool(10_000)
    cache = RadixCache(pool)
    for p in prompts:
        cache.insert(p, pool.alloc_extend([], len(p)))
    return cache


class Scripted:
    """A random draw (a router policy's `randrange`) that returns the given values in order, checking
    each bound it is asked for."""

    def __init__(self, *draws: tuple[int, int]) -> None:
        self.draws = list(draws)  # (expected n, value)

    def randrange(self, n: int) -> int:
        expected_n, value = self.draws.pop(0)
        assert n == expected_n, (n, expected_n)
        return value

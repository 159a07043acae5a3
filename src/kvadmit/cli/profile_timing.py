"""`kvadmit profile`'s measuring: the real torch executor and the real Engine timed on this machine (the
fit into a cost model is costmodel/profile.py's).

Decode: for each batch size B and context length L, B requests that each hold L tokens of KV (slots of
their own, as in a server: shared slots would read the same memory B times, from cache) decode one
token; the step time is the median of `repeats` runs after a warm-up. Prefill: R requests of N tokens
each, from an empty cache. Last, the engine loop's own time per step: a few requests run through the real
Engine (scheduler, executor, bookkeeping) on the wall clock, and what each step took beyond the
executor's own time is the loop's overhead.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from kvadmit.config import ServerArgs
from kvadmit.costmodel.profile import Measurement, Profile, fit_profile
from kvadmit.engine import Engine, WallClock
from kvadmit.executor.base import StepResult
from kvadmit.executor.torch_runner import TorchExecutor
from kvadmit.model.llama import CausalLM
from kvadmit.request import Req, SamplingLimits
from kvadmit.sampling_params import SamplingParams
from kvadmit.scheduler.scheduler import Scheduler
from kvadmit.scheduler.types import ScheduledBatch

GREEDY = SamplingParams(temperature=0.0)


def _req(rid: str, prompt_len: int, vocab: int) -> Req:
    req = Req(rid, [(7 * i + 3) % vocab for i in range(prompt_len)], SamplingLimits(16))
    req.params = GREEDY
    return req


def _decode_batch(batch: int, context: int, vocab: int) -> ScheduledBatch:
    """`batch` requests, each with `context` KV tokens in slots of its own and one new token to decode."""
    reqs = []
    for i in range(batch):
        req = _req(f"d{i}", context, vocab)
        req.output_ids = [1]
        req.kv = list(range(i * (context + 1), (i + 1) * (context + 1)))
        reqs.append(req)
    return ScheduledBatch(kind="decode", reqs=reqs)


def _prefill_batch(requests: int, tokens: int, vocab: int) -> ScheduledBatch:
    reqs = []
    for i in range(requests):
        req = _req(f"p{i}", tokens, vocab)
        req.prefix_len, req.fill_len, req.extend_input_len = 0, tokens, tokens
        req.kv = list(range(i * tokens, (i + 1) * tokens))
        reqs.append(req)
    return ScheduledBatch(kind="prefill", reqs=reqs)


def settle(executor: TorchExecutor, batch: ScheduledBatch, max_seconds: float = 30.0) -> int:
    """Run `batch` until its step time settles; the number of runs.

    A fresh process runs its first steps many times slower than later ones (measured here: a one-request
    decode of the default model took 1.9 s for its first eight steps, then 59 ms), long after the first
    call. Settled: at least five runs and the last three each within 1.5× the fastest so far."""
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < max_seconds:
        times.append(executor.run(batch).seconds)
        if len(times) >= 5 and max(times[-3:]) <= 1.5 * min(times):
            break
    return len(times)


def _time(executor: TorchExecutor, batch: ScheduledBatch, repeats: int) -> float:
    executor.run(batch)  # warm-up
    return statistics.median(executor.run(batch).seconds for _ in range(repeats))


def profile_model(
    model: CausalLM,
    batch_sizes: Sequence[int] = (1, 4, 16, 64),
    context_lens: Sequence[int] = (128, 512, 2048),
    prefill_lens: Sequence[int] = (32, 128, 512, 2048),
    prefill_requests: Sequence[int] = (1, 4),
    repeats: int = 3,
    progress: Callable[[Measurement], None] | None = None,
    compile_max_bs: int | None = None,
) -> Profile:
    vocab = model.cfg.vocab_size
    pool = max(
        max(batch_sizes) * (max(context_lens) + 1),
        max(prefill_lens) * max(prefill_requests),
        2 * LOOP_REQUESTS * (LOOP_PROMPT + LOOP_OUTPUT),  # room for all of them at once
    )
    executor = TorchExecutor(model, pool, compile_max_bs=compile_max_bs)
    settle(executor, _decode_batch(min(batch_sizes), min(context_lens), vocab))
    found: list[Measurement] = []

    def record(m: Measurement) -> None:
        found.append(m)
        if progress is not None:
            progress(m)

    for b in batch_sizes:
        for c in context_lens:
            record(Measurement("decode", b, c, _time(executor, _decode_batch(b, c, vocab), repeats)))
    for r in prefill_requests:
        for n in prefill_lens:
            record(Measurement("prefill", r, n, _time(executor, _prefill_batch(r, n, vocab), repeats)))
    overhead_ms, loop_steps = loop_overhead_ms(executor, pool, vocab)
    return fit_profile(found, overhead_ms, loop_steps, describe_machine())


# The engine-loop probe: LOOP_REQUESTS requests of LOOP_PROMPT prompt tokens and LOOP_OUTPUT outputs.
LOOP_REQUESTS, LOOP_PROMPT, LOOP_OUTPUT = 4, 48, 24


class _Quiet:
    """The probe's listener: nobody streams its tokens."""

    def on_step(self, batch: ScheduledBatch, now: float) -> None:
        pass

    def on_finish(self, req: Req, now: float) -> None:
        pass


def loop_overhead_ms(executor: TorchExecutor, pool: int, vocab: int) -> tuple[float, int]:
    """Run a few requests through the real Engine on the wall clock; (the mean of each step's wall time
    minus the executor's own time for it, in ms; the steps measured)."""
    # The non-overlap loop: each step is timed on its own, its result processed before the next.
    scheduler = Scheduler(
        ServerArgs(max_total_tokens=pool, disable_overlap_schedule=True), context_len=4 * pool
    )
    seconds: list[float] = []

    def executor_time(batch: ScheduledBatch, result: StepResult, now: float) -> None:
        seconds.append(result.seconds)

    engine = Engine(scheduler, executor, WallClock(), _Quiet(), (), (executor_time,))
    for i in range(LOOP_REQUESTS):
        req = _req(f"loop{i}", LOOP_PROMPT, vocab)
        req.sampling = SamplingLimits(requested_max_new_tokens=LOOP_OUTPUT, ignore_eos=True)
        req.origin_input_ids = [(11 * j + 5 * i + 1) % vocab for j in range(LOOP_PROMPT)]
        engine.submit(req)
    walls: list[float] = []
    while True:
        start = time.perf_counter()
        ran = engine.step()
        if not ran:
            break
        walls.append(time.perf_counter() - start)
    extra = [1000 * (w - s) for w, s in zip(walls, seconds, strict=True)]
    return (statistics.mean(extra) if extra else 0.0), len(extra)


def describe_machine() -> str:
    cpu = platform.processor() or platform.machine()
    return f"{cpu}, torch {torch.__version__}, {torch.get_num_threads()} threads"

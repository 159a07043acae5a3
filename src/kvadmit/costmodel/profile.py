"""`kvadmit profile`: time the real executor on this machine and fit a cost model to it.

Decode: for each batch size B and context length L, B requests that each hold L tokens of KV (slots of
their own, as in a server: shared slots would read the same memory B times, from cache) decode one
token; the step time is the median of `repeats` runs after a warm-up. Prefill: R requests of N tokens
each, from an empty cache. The same fit as calibration (fit.py) then gives

    decode  step = base_ms + per_request_ms × B + per_kv_token_ms × (B × L)
    prefill step = base_ms + per_request_ms × R + (R × N) / tokens_per_s

and the decode grid itself goes into the cost model as its table (costmodel.DecodeTable): the simulator
reads the measured step times, the coefficients are the fit for reading (on this machine's CPU one
request decodes through a matrix-vector path at half the cost of two, which no line through the grid
follows).

Last, the engine loop's own time per step: a few requests run through the real Engine (scheduler,
executor, bookkeeping) on the wall clock, and what each step took beyond the executor's own time is the
loop's overhead. Its mean is added to every decode and prefill step of the cost model.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel, DecodeCost, DecodeTable, PrefillCost
from kvadmit.costmodel.fit import StepFit, fit_step_time
from kvadmit.engine import Engine, WallClock
from kvadmit.executor.base import StepResult
from kvadmit.executor.torch_runner import TorchExecutor
from kvadmit.model.llama import CausalLM
from kvadmit.request import Req, SamplingLimits
from kvadmit.sampling_params import SamplingParams
from kvadmit.scheduler.scheduler import Scheduler
from kvadmit.scheduler.types import ScheduledBatch

GREEDY = SamplingParams(temperature=0.0)


@dataclass(frozen=True, slots=True)
class Measurement:
    kind: str  # "decode" or "prefill"
    requests: int
    tokens: int  # decode: context tokens per request; prefill: new tokens per request
    seconds: float  # median step time


@dataclass(slots=True)
class Profile:
    cost: CostModel
    measurements: list[Measurement]
    decode_fit: StepFit
    prefill_fit: StepFit
    loop_overhead_ms: float = 0.0  # the engine loop's mean time per step beyond the executor's
    loop_steps: int = 0  # the steps it was measured over


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
) -> Profile:
    vocab = model.cfg.vocab_size
    pool = max(
        max(batch_sizes) * (max(context_lens) + 1),
        max(prefill_lens) * max(prefill_requests),
        2 * LOOP_REQUESTS * (LOOP_PROMPT + LOOP_OUTPUT),  # room for all of them at once
    )
    executor = TorchExecutor(model, pool)
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
    decode = [m for m in found if m.kind == "decode"]
    prefill = [m for m in found if m.kind == "prefill"]
    dfit = fit_step_time(
        [{"batch": m.requests, "kv": m.requests * m.tokens} for m in decode],
        [1000 * m.seconds for m in decode],
        ("one", "batch", "kv"),
    )
    pfit = fit_step_time(
        [{"requests": m.requests, "tokens": m.requests * m.tokens} for m in prefill],
        [1000 * m.seconds for m in prefill],
        ("one", "requests", "tokens"),
    )
    per_token_ms = pfit.coef["tokens"]
    overhead_ms, loop_steps = loop_overhead_ms(executor, pool, vocab)
    step_ms = {(m.requests, m.tokens): 1000 * m.seconds for m in decode}
    sizes, lens = tuple(sorted(set(batch_sizes))), tuple(sorted(set(context_lens)))
    table = DecodeTable(sizes, lens, tuple(tuple(step_ms[(b, c)] + overhead_ms for c in lens) for b in sizes))
    cost = CostModel(
        DecodeCost(
            base_ms=dfit.coef["one"] + overhead_ms,
            per_request_ms=dfit.coef["batch"],
            per_kv_token_ms=dfit.coef["kv"],
            table=table,
        ),
        PrefillCost(
            base_ms=pfit.coef["one"] + overhead_ms,
            per_request_ms=pfit.coef["requests"],
            tokens_per_s=1000 / per_token_ms if per_token_ms > 0 else 1e12,
        ),
    )
    return Profile(cost, found, dfit, pfit, overhead_ms, loop_steps)


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
    scheduler = Scheduler(ServerArgs(max_total_tokens=pool), context_len=4 * pool)
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


def with_metadata(profile: Profile, model_name: str, dtype: str) -> CostModel:
    d, p = profile.decode_fit, profile.prefill_fit
    meta = {
        "name": f"profile:{model_name}",
        "source": "kvadmit profile (the torch executor, measured)",
        "notes": [
            f"measured on {describe_machine()}, dtype {dtype}",
            "decode grid (batch × context tokens per request): "
            + ", ".join(f"{m.requests}×{m.tokens}" for m in profile.measurements if m.kind == "decode"),
            "prefill grid (requests × tokens each): "
            + ", ".join(f"{m.requests}×{m.tokens}" for m in profile.measurements if m.kind == "prefill"),
            f"+ {profile.loop_overhead_ms:.2f} ms per step (decode table, decode and prefill base_ms): the "
            f"engine loop around the executor (scheduler, bookkeeping), measured over {profile.loop_steps} "
            "steps of the real Engine; HTTP and streaming are not in it",
        ],
        "fit": {
            "decode_mean_abs_error_pct": round(100 * d.mean_abs_error, 2),
            "decode_max_abs_error_pct": round(100 * d.max_abs_error, 2),
            "prefill_mean_abs_error_pct": round(100 * p.mean_abs_error, 2),
            "prefill_max_abs_error_pct": round(100 * p.max_abs_error, 2),
            "outliers": len(d.outliers) + len(p.outliers),
            "loop_overhead_ms": round(profile.loop_overhead_ms, 3),
        },
    }
    return CostModel(profile.cost.decode, profile.cost.prefill, meta)

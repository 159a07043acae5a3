"""`kvadmit profile`'s fit: the measured step times of the real executor, made into a cost model.

The measuring (cli/profile_timing.py) times decode steps of B requests that each hold L tokens of KV and
prefill steps of R requests of N tokens each, and the engine loop's own time per step. The same fit as
calibration (fit.py) then gives

    decode  step = base_ms + per_request_ms × B + per_kv_token_ms × (B × L)
    prefill step = base_ms + per_request_ms × R + (R × N) / tokens_per_s

and the decode grid itself goes into the cost model as its table (costmodel.DecodeTable): the simulator
reads the measured step times, the coefficients are the fit for reading (on this machine's CPU one
request decodes through a matrix-vector path at half the cost of two, which no line through the grid
follows). The engine loop's mean time per step beyond the executor's is added to every decode and prefill
step of the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadmit.costmodel.costmodel import CostModel, DecodeCost, DecodeTable, PrefillCost
from kvadmit.costmodel.fit import StepFit, fit_step_time


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
    machine: str = ""  # where it was measured: the CPU, the torch version and its threads


def fit_profile(
    measurements: list[Measurement], loop_overhead_ms: float, loop_steps: int, machine: str
) -> Profile:
    """The cost model of a measured grid (every batch size × every context length for decode), with the
    engine loop's time per step added to every step."""
    decode = [m for m in measurements if m.kind == "decode"]
    prefill = [m for m in measurements if m.kind == "prefill"]
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
    step_ms = {(m.requests, m.tokens): 1000 * m.seconds for m in decode}
    sizes, lens = tuple(sorted({m.requests for m in decode})), tuple(sorted({m.tokens for m in decode}))
    oh = loop_overhead_ms
    table = DecodeTable(sizes, lens, tuple(tuple(step_ms[(b, c)] + oh for c in lens) for b in sizes))
    cost = CostModel(
        DecodeCost(
            base_ms=dfit.coef["one"] + oh,
            per_request_ms=dfit.coef["batch"],
            per_kv_token_ms=dfit.coef["kv"],
            table=table,
        ),
        PrefillCost(
            base_ms=pfit.coef["one"] + oh,
            per_request_ms=pfit.coef["requests"],
            tokens_per_s=1000 / per_token_ms if per_token_ms > 0 else 1e12,
        ),
    )
    return Profile(cost, measurements, dfit, pfit, oh, loop_steps, machine)


def with_metadata(profile: Profile, model_name: str, dtype: str) -> CostModel:
    d, p = profile.decode_fit, profile.prefill_fit
    meta = {
        "name": f"profile:{model_name}",
        "source": "kvadmit profile (the torch executor, measured)",
        "notes": [
            f"measured on {profile.machine}, dtype {dtype}",
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

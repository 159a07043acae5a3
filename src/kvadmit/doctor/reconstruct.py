"""A server and its workload, reconstructed from its log alone (issue 21): each figure an `Inferred`,
saying how it was inferred and how sure it is. The server's side is reconstruct_server.py, the
workload's reconstruct_workload.py; this joins them over the window the doctor simulates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.doctor import reconstruct_server as server
from kvadmit.doctor import reconstruct_workload as workload
from kvadmit.doctor.inferred import Inferred
from kvadmit.doctor.observed import Observed

# The simulated window is at most this long (the what-if must stay fast on long logs): the part of the
# log around the first retraction, or its start.
MAX_WINDOW_S = 300.0
LEAD_BEFORE_RETRACTION_S = 60.0


class CannotReconstruct(Exception):
    """The log does not hold what a reconstruction needs; the message says what is missing."""


@dataclass(slots=True)
class Reconstruction:
    pool: Inferred[int]
    pool_range: tuple[int, int]
    chunked_prefill_size: Inferred[int | None]
    max_prefill_tokens: Inferred[int]
    max_running_requests: Inferred[int | None]
    decode_log_interval: Inferred[int]
    cost: Inferred[CostModel]
    window: tuple[float, float]  # absolute seconds: the part of the log simulated
    resolution_s: float  # the timestamps' resolution (1 s for SGLang's)
    start: workload.Start
    arrivals: workload.Arrivals
    prompt_len: Inferred[float]
    output_len: Inferred[float]
    max_new_tokens: Inferred[float]
    stops_early: Inferred[bool]
    remaining_output: Inferred[float]
    running_at_first_retraction: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def span_s(self) -> float:
        return self.window[1] - self.window[0] + self.resolution_s

    def server_args(self, **overrides: Any) -> ServerArgs:
        values: dict[str, Any] = {
            "max_total_tokens": self.pool.value,
            "chunked_prefill_size": self.chunked_prefill_size.value,
            "max_prefill_tokens": self.max_prefill_tokens.value,
            "max_running_requests": self.max_running_requests.value,
            "decode_log_interval": self.decode_log_interval.value,
        }
        values.update(overrides)
        return ServerArgs(**values)

    def figures(self) -> dict[str, Inferred[Any]]:
        return {
            "pool": self.pool,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.max_prefill_tokens,
            "max_running_requests": self.max_running_requests,
            "decode_log_interval": self.decode_log_interval,
            "request_rate": self.arrivals.rate,
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "max_new_tokens": self.max_new_tokens,
            "stops_early": self.stops_early,
            "remaining_output": self.remaining_output,
        }

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v.to_json() for k, v in self.figures().items()}
        out["pool"]["range"] = list(self.pool_range)
        out["cost_model"] = {"how": self.cost.how, "confidence": self.cost.confidence}
        out["window_s"] = round(self.span_s, 1)
        out["start"] = {"running": self.start.running, "tokens": self.start.tokens, "queue": self.start.queue}
        out["arrivals"] = len(self.arrivals.times)
        out["notes"] = self.notes
        return out


def _window(obs: Observed) -> tuple[float, float]:
    span = obs.span
    assert span is not None
    t0, t1 = span
    if t1 - t0 <= MAX_WINDOW_S:
        return t0, t1
    if obs.retracts:
        t0 = max(t0, obs.retracts[0].t - LEAD_BEFORE_RETRACTION_S)
    return t0, min(t1, t0 + MAX_WINDOW_S)


def _resolution(obs: Observed) -> float:
    return 1.0 if all(t == int(t) for t in obs.times[:200]) else 0.0


def reconstruct(obs: Observed) -> Reconstruction:
    if len(obs.decodes) < 2:
        raise CannotReconstruct("fewer than two timed Decode batch lines")
    found = server.infer_pool(obs)
    if found is None:
        raise CannotReconstruct("no Decode line gives both #token and token usage")
    pool, pool_range = found
    interval = Inferred(ServerArgs().decode_log_interval, "not shown: SGLang's default", "guess")
    t0, t1 = _window(obs)
    events = workload.window_events(obs, t0, t1)
    start = workload.infer_start(events, pool.value)
    if start is None:
        raise CannotReconstruct("no batch line in the window")
    resolution = _resolution(obs)
    arrivals = workload.infer_arrivals(events, start, t1 - t0 + resolution)
    prompt, output = workload.infer_lengths(obs, interval.value, workload.infer_prompt(obs))
    budget = workload.infer_budget(obs, pool.value, prompt.value, output.value)
    early = budget.value > 1.2 * output.value
    stops = Inferred(
        early,
        f"mean output {output.value:,.0f} {'well below' if early else 'close to'} the mean max_new_tokens "
        f"{budget.value:,.0f}",
        "guess" if "guess" in (budget.confidence, output.confidence) else "estimate",
    )
    notes = []
    if obs.span and (t0, t1) != obs.span:
        notes.append(f"simulated {t1 - t0:.0f} s of the log's {obs.span[1] - obs.span[0]:.0f} s")
    first_running = None
    if obs.retracts:
        before = [d for d in obs.decodes if d.t <= obs.retracts[0].t]
        first_running = before[-1].running if before else None
    return Reconstruction(
        pool, pool_range, server.infer_chunked_prefill(obs), server.infer_max_prefill(obs),
        server.infer_max_running(obs), interval, server.infer_cost(obs, interval.value), (t0, t1),
        resolution, start, arrivals, prompt, output, budget, stops,
        workload.infer_remaining(obs, interval.value, output.value), first_running, notes,
    )  # fmt: skip

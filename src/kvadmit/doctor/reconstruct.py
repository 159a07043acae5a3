"""A server and its workload, reconstructed from its log alone (issue 21): each figure an `Inferred`,
saying how it was inferred and how sure it is. The server's side is reconstruct_server.py, the
workload's reconstruct_workload.py; this joins them over the window the doctor simulates."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, fields
from typing import Any

from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.doctor import arrivals as arrivals_from_log
from kvadmit.doctor import reconstruct_server as server
from kvadmit.doctor import reconstruct_workload as workload
from kvadmit.doctor.inferred import Inferred
from kvadmit.doctor.lengths import OutputLengths
from kvadmit.doctor.observed import Observed
from kvadmit.doctor.readmissions import track_readmissions

# The simulated window is at most this long (the what-if must stay fast on long logs): the part of the
# log around the first retraction, or its start.
MAX_WINDOW_S = 300.0
LEAD_BEFORE_RETRACTION_S = 60.0
NO_CAP = 10**9  # a budget no output reaches
OVERLAP_FIELD = "disable_overlap_schedule"  # ServerArgs' name for the loop, as SGLang spells the flag


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
    conservativeness: Inferred[float]
    overlap: Inferred[bool | None]  # SGLang's overlap loop (None: the log does not show it)
    cost: Inferred[CostModel]
    window: tuple[float, float]  # absolute seconds: the part of the log simulated
    resolution_s: float  # the timestamps' resolution (1 s for SGLang's)
    start: workload.Start
    arrivals: arrivals_from_log.Arrivals
    prompt_len: Inferred[float]
    output_len: Inferred[float]
    max_new_tokens: Inferred[float]
    stops_early: Inferred[bool]
    output_spread: Inferred[float]  # CV² of the output lengths (lengths.py)
    remaining_output: Inferred[float]  # of the requests running when the window opens
    prompt_spread: Inferred[float]  # CV² of the prompt lengths
    running_at_first_retraction: int | None = None
    notes: list[str] = field(default_factory=list)
    # Each request reserves its whole max_new_tokens and generates all of it (bench_serving's default
    # ignore_eos; SGLang 0.5.22 reserves such a request at ratio 1): set by judge_reservation.
    reserves_all: Inferred[bool] = field(
        default_factory=lambda: Inferred(False, "requests reserve at the new-token ratio", "guess")
    )
    # The running requests' progress at the window's opening spreads over [floor, 2 − floor] × its mean
    # (resimulate.running_progress; opening.py chooses it).
    progress_floor: float = 0.0
    # Where the random draws of what the log does not show start (log_seed): the log's own, so that
    # two logs get draws of their own.
    seed: int = 0

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
            "schedule_conservativeness": self.conservativeness.value,
        }
        if self.overlap.value is not None and OVERLAP_FIELD in {f.name for f in fields(ServerArgs)}:
            values[OVERLAP_FIELD] = not self.overlap.value
        values.update(overrides)
        return ServerArgs(**values)

    def figures(self) -> dict[str, Inferred[Any]]:
        return {
            "pool": self.pool,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.max_prefill_tokens,
            "max_running_requests": self.max_running_requests,
            "decode_log_interval": self.decode_log_interval,
            "schedule_conservativeness": self.conservativeness,
            "overlap_loop": self.overlap,
            "request_rate": self.arrivals.rate,
            "prompt_len": self.prompt_len,
            "prompt_spread": self.prompt_spread,
            "output_len": self.output_len,
            "max_new_tokens": self.max_new_tokens,
            "stops_early": self.stops_early,
            "output_spread": self.output_spread,
            "remaining_output": self.remaining_output,
            "reserves_all": self.reserves_all,
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


def _loop_note(overlap: Inferred[bool | None]) -> str:
    """The scheduler loop simulated, said out loud: the log shows it only in a server_args line."""
    has_field = OVERLAP_FIELD in {f.name for f in fields(ServerArgs)}
    overlap_default = has_field and not getattr(ServerArgs(), OVERLAP_FIELD)
    default = "the overlap loop" if overlap_default else "one step at a time"
    if overlap.value is None:
        return f"loop: not shown in the log (no server_args line); assumed the simulator's default, {default}"
    shown = "the overlap loop" if overlap.value else "one step at a time (--disable-overlap-schedule)"
    if not has_field:
        return f"loop: the log shows {shown}; this simulator runs one step at a time"
    return f"loop: {shown}, as the server_args line shows"


def _budget(
    obs: Observed, pool: int, prompt: Inferred[float], output: Inferred[float], spread: Inferred[float]
) -> tuple[Inferred[float], Inferred[bool]]:
    """The mean max_new_tokens and whether requests stop short of it. Without a retraction to tell, the
    budget is at least the longest output the spread gives."""
    budget = workload.infer_budget(obs, pool, prompt.value, output.value)
    longest = OutputLengths(output.value, spread.value, NO_CAP).longest()
    if budget.confidence == "guess" and longest > budget.value:
        how = f"not shown (no retraction): at least the longest output the spread gives ({longest:,})"
        budget = Inferred(float(longest), how, "guess")
    early = budget.value > 1.2 * output.value
    how = f"mean output {output.value:,.0f} {'well below' if early else 'close to'} the mean max_new_tokens "
    how += f"{budget.value:,.0f}"
    if not early:
        how += ": each request runs to its own max_new_tokens, as long as its output"
    sure = "guess" if "guess" in (budget.confidence, output.confidence) else "estimate"
    return budget, Inferred(early, how, sure)


def lengths(rec: Reconstruction, budget: int | None = None) -> OutputLengths:
    """The output lengths simulated, capped at the reconstruction's budget or at `budget`."""
    asked = budget if budget is not None else max(round(rec.max_new_tokens.value), 1)
    if not rec.stops_early.value and budget is None:  # each request's budget is its own length: no cap
        asked = OutputLengths(rec.output_len.value, rec.output_spread.value, NO_CAP).longest()
    return OutputLengths(rec.output_len.value, rec.output_spread.value, asked)


def log_seed(obs: Observed) -> int:
    """A seed of the log's own: the CRC-32 of its batch lines (under 10⁹, so that the draws' seeds added
    to it stay under numpy's 2³²).

    Why: what the log does not show (which request gets which length, when in its second it came) is
    drawn at random, a few times (prove.DRAWS). With the same seeds for every log, logs that reconstruct
    alike (the five seeds of one workload) were simulated with the same few arrangements, and one unlucky
    set showed as the same miss on all of them: the uniform-stop round trip retracted 22, 26, 17, 25, 20
    times against 43, 43, 14, 54, 33, while the reconstruction's own ensemble retracts as the actual runs
    do (docs/doctor.md)."""
    crc = 0
    for text in obs.batch_texts:
        crc = zlib.crc32(text.encode("utf-8", "replace"), crc)
    return crc % 10**9


def reconstruct(obs: Observed) -> Reconstruction:
    if len(obs.decodes) < 2:
        raise CannotReconstruct("fewer than two timed Decode batch lines")
    found = server.infer_pool(obs)
    if found is None:
        if any(d.tokens and d.usage == 0 for d in obs.decodes):  # a pool too big for 2 decimals to show
            raise CannotReconstruct(
                "token usage reads 0.00 on every Decode line that gives #token: the pool is more than "
                "#token ÷ 0.005, and no line says how much more"
            )
        raise CannotReconstruct("no Decode line gives both #token and token usage")
    pool, pool_range = found
    interval = server.infer_decode_log_interval(obs)
    t0, t1 = _window(obs)
    events = workload.window_events(obs, t0, t1)
    start = workload.infer_start(events, pool.value)
    if start is None:
        raise CannotReconstruct("no batch line in the window")
    resolution = _resolution(obs)
    seed = log_seed(obs)
    arrivals = arrivals_from_log.infer_arrivals(events, start, t1 - t0 + resolution, resolution, seed)
    tracked = track_readmissions(obs)
    prompt_in = workload.infer_prompt(obs, tracked)
    unfreed = workload.unfreed_by_retraction(obs, tracked, prompt_in.value) if prompt_in else 0.0
    prompt, output = workload.infer_lengths(obs, interval.value, prompt_in, unfreed)
    spread = workload.infer_spread(obs, prompt, output)
    budget, stops = _budget(obs, pool.value, prompt, output, spread)
    notes = [_loop_note(server.infer_overlap(obs))]
    if obs.span and (t0, t1) != obs.span:
        notes.append(f"simulated {t1 - t0:.0f} s of the log's {obs.span[1] - obs.span[0]:.0f} s")
    first_running = None
    if obs.retracts:
        before = [d for d in obs.decodes if d.t <= obs.retracts[0].t]
        first_running = before[-1].running if before else None
    return Reconstruction(
        pool, pool_range, server.infer_chunked_prefill(obs), server.infer_max_prefill(obs),
        server.infer_max_running(obs), interval, server.infer_conservativeness(obs),
        server.infer_overlap(obs), server.infer_cost(obs, interval.value), (t0, t1),
        resolution, start, arrivals, prompt, output, budget, stops,
        spread, workload.infer_remaining(obs, interval.value, output.value),
        workload.infer_prompt_spread(obs, tracked), first_running, notes, seed=seed,
    )  # fmt: skip

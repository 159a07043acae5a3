"""A reconstruction run through the simulator (sim/run.py) with the server's flags, or with changed ones.

The requests: those running when the window opens, sent over a warm-up before it (each sent as long
before the window as it had been decoding: progress spread evenly over its output, so the pool holds
about what the log shows and the ratio has decayed), those waiting then, sent just before it, and the
arrivals inferred inside it. Prompts spread as the lines that admit one request show (the mean, when too
few do). Every request has the inferred max_new_tokens; it stops
at its own output length (spread evenly around the mean when requests stop early, the budget when they
do not). The simulated log lines of the window are what the replay check and the what-ifs compare."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np

from kvadmit.bench.metrics import RequestOutcome
from kvadmit.bench.workload import SimRequest, WorkloadSpec
from kvadmit.costmodel.costmodel import DecodeCost, PrefillCost
from kvadmit.doctor.lengths import OutputLengths
from kvadmit.doctor.observed import Observed, observe_lines
from kvadmit.doctor.reconstruct import NO_CAP, Reconstruction, lengths
from kvadmit.observe.loglines import timestamp_prefix
from kvadmit.sim.replay import Replay
from kvadmit.sim.run import SimConfig, SimResult, simulate

VOCAB = 32000
WARMUP_MARGIN_S = 1.0
SEEDS_PER_DRAW = 10  # each draw of a replay takes its generators' seeds from 10 × draw on


@dataclass(slots=True)
class SimRun:
    label: str
    overrides: dict[str, Any]
    result: SimResult
    lines: list[str]  # the simulated log
    window_lines: list[str]  # the start-up line and the window's lines
    observed: Observed  # the window's lines, read back
    outcomes: list[RequestOutcome]  # the requests sent from the window's opening on


def build_replay(
    rec: Reconstruction, budget: int | None = None, draw: int = 0, running_only: bool = False
) -> tuple[Replay, float]:
    """The requests and their send times (seconds from the simulation's start), and the warm-up's length:
    the window opens that many seconds into the simulation. `draw` picks another arrangement of what the
    log does not show (which request gets which length and prompt, their token ids), its seeds counted
    from the log's own (reconstruct.log_seed); `running_only` leaves out all but the requests running when
    the window opens (opening.py)."""
    s = rec.seed + SEEDS_PER_DRAW * draw  # the log's own draws (reconstruct.log_seed)
    prompt = max(round(rec.prompt_len.value), 1)
    dist = lengths(rec, budget)
    asked = dist.budget
    n_run, n_wait = rec.start.running, rec.start.queue
    n = n_run + n_wait + len(rec.arrivals.times)
    outs = dist.spread(n, seed=s + 1)
    # The running requests' progress: its mean what the log's #token shows per request.
    held = max(rec.start.tokens / n_run - prompt, 0.0) if n_run else 0.0
    done = running_progress(n_run, held, asked, rec.progress_floor)
    outs[:n_run] = running_lengths(rec, dist, done, s + 3)
    progress = warmup_seconds(rec.cost.value.decode, prompt, done, rec.cost.value.prefill)
    warmup = (max(progress) if progress else 0.0) + WARMUP_MARGIN_S
    times = [warmup - p for p in progress]
    times += [warmup - 0.001 * (n_wait - k) / max(n_wait, 1) for k in range(n_wait)]
    t0 = rec.start.t
    times += [warmup + (t - t0) for t in rec.arrivals.times]
    offsets = np.random.RandomState(s + 2).randint(0, VOCAB, size=n).tolist()
    order = sorted(range(n_run if running_only else n), key=lambda i: times[i])
    # Requests that run to their own max_new_tokens ask for their length (with ignore_eos when they
    # reserve all of it); the others ask for the common budget and stop early.
    own = not rec.stops_early.value and budget is None
    eos = rec.reserves_all.value
    prompts = OutputLengths(prompt, rec.prompt_spread.value, NO_CAP).spread(n, seed=s + 4)
    reqs = tuple(
        SimRequest(
            j, prompts[i], outs[i], outs[i] if own else asked, None if eos else outs[i], eos, offsets[i]
        )
        for j, i in enumerate(order)
    )
    arrivals = tuple(times[i] for i in order)
    return Replay(reqs, arrivals, tuple(f"r{j}" for j in range(len(order)))), warmup


def running_progress(n_run: int, held: float, asked: int, floor: float = 0.0) -> list[int]:
    """What each of the requests running when the window opens has generated: spread evenly over
    [floor × held, (2 − floor) × held], whose mean is `held` (floor 0: from nothing to twice the mean;
    opening.py raises the floor when the least advanced could not have been admitted so late)."""
    return [min(round((floor + (k + 0.5) / n_run * 2 * (1 - floor)) * held), asked - 1) for k in range(n_run)]


def warmup_seconds(
    decode: DecodeCost, prompt: int, done: list[int], prefill: PrefillCost | None = None
) -> list[float]:
    """How long before the window each running request must be sent to have generated `done` tokens by
    then: the decode steps since, each as long as the cost model says for the batch of that moment (j
    steps before the window, the requests with at least j tokens, each holding its prompt and d − j),
    and the prefill of each request admitted since (a step that gives the running ones no token). One
    step time for all, the full batch's, sent them too early (log 04: 25.3 ms a step at 67 running,
    18.4 ms at 10), and the short ones finished before the window opened; without the prefills, too
    late (log 04's replay opened with 76,767 tokens held against the log's 81,316)."""
    if not done:
        return []
    ranked = sorted(done, reverse=True)
    elapsed = [0.0] * (ranked[0] + 1)  # elapsed[j]: seconds from j steps before the window to it
    batch = held = 0
    k = 0
    for j in range(ranked[0], 0, -1):
        joined = 0
        while k < len(ranked) and ranked[k] >= j:  # a request that has generated j tokens is running
            batch += 1
            joined += 1
            held += prompt + ranked[k] - j
            k += 1
        elapsed[j - 1] = decode.seconds(batch, held)
        if joined and prefill is not None:
            elapsed[j - 1] += prefill.seconds(joined, joined * prompt, 0)
        held += batch  # one token each for the step
    for j in range(1, len(elapsed)):
        elapsed[j] += elapsed[j - 1]
    return [elapsed[d - 1] if d > 0 else 0.0 for d in done]


def running_lengths(rec: Reconstruction, dist: OutputLengths, done: list[int], seed: int = 3) -> list[int]:
    """The whole output of each request running when the window opens, given what it has generated.

    As a rule, drawn from the lengths beyond its progress (lengths.py's beyond). But when the log's own
    finishing says they have more left than any length within the budget allows (request-steps decoded ÷
    finishes over the budget: a storm, where the few that finish are the short ones and set the mean
    output too low), what each has left is exponential with that mean, drawn without the budget and cut at
    it: the rate at which the log's requests finished, so the short ones still finish (log 04: 11 of its
    67 in 21 s, remaining 3,825 against a budget of 2,686; drawn from the lengths, none retracted; kept
    within the budget at that mean, none finished and 74 retracted a minute against the log's 46)."""
    remaining = rec.remaining_output
    if remaining.confidence == "guess" or remaining.value <= dist.budget:
        return [min(x, dist.budget) for x in dist.beyond(done, seed=seed)]
    left = OutputLengths(remaining.value, 1.0, NO_CAP).spread(len(done), seed=seed)
    return [max(min(d + x, dist.budget), d + 1) for d, x in zip(done, left, strict=True)]


def run(
    rec: Reconstruction, label: str, overrides: dict[str, Any], budget: int | None = None, draw: int = 0
) -> SimRun:
    """Simulate the reconstruction with ServerArgs fields overridden (none: the server as it was)."""
    replay, warmup = build_replay(rec, budget, draw)
    args = rec.server_args(**overrides)
    start = datetime.fromtimestamp(rec.start.t - warmup, tz=timezone.utc).replace(tzinfo=None)
    spec = WorkloadSpec(num_prompts=len(replay.requests), vocab_size=VOCAB)
    cfg = SimConfig(args, spec, rec.cost.value, warmup_requests=0, start=start, replay=replay)
    lines: list[str] = []
    result = simulate(cfg, emit_log=lines.append)
    window = _window_lines(lines, rec)
    sent_from = warmup - 0.01
    outcomes = [o for o, t in zip(result.outcomes, replay.arrivals, strict=True) if t >= sent_from]
    return SimRun(label, overrides, result, lines, window, observe_lines(window), outcomes)


def _stamp(t: float) -> str:
    return timestamp_prefix(datetime.fromtimestamp(t, tz=timezone.utc).replace(tzinfo=None))[1:20]


def _window_lines(lines: list[str], rec: Reconstruction) -> list[str]:
    """The start-up line, then the lines stamped within the window (compared as text: same format)."""
    lo, hi = _stamp(rec.window[0]), _stamp(rec.window[1])
    kept = [line for line in lines[1:] if line.startswith("[") and lo <= line[1:20] <= hi]
    return lines[:1] + kept


def diagnose_lines(lines: list[str]) -> str:
    """The doctor's verdict on simulated log lines (written to a temporary file and read as a log)."""
    from kvadmit.doctor.diagnose import Inputs, diagnose

    fd, path = tempfile.mkstemp(suffix=".log", prefix="kvadmit-whatif-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        return diagnose(Inputs(log=path)).verdict
    finally:
        os.unlink(path)

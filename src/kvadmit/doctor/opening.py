"""The requests running when the window opens must all be running in the replay too (issue 21).

The replay sends them over a warm-up, each as long before the window as its progress took
(resimulate.py), and the scheduler admits each under its own reservation. Their progress is spread
evenly from nothing to twice the mean the log's #token shows, so the least advanced arrive in the warm-up's
last steps, when the pool is as full as the log shows it: on log 04 (67 running, 81,316 of ~87,546
tokens held, a new request needing its 485-token prompt and the budget of 2,686 beyond the others'
reservations) the last 3 did not fit, and the replay opened with 64 running and 12 waiting where the log
shows 67 and 9. The server did admit them, so they came while there was room for them: the warm-up never
replays the requests that finished before the window and made that room, so a request that joined in
the warm-up's last steps could not have. The rule: the progress spread is the widest (its floor the
lowest of PROGRESS_FLOORS) with which the warm-up admits every running request; the mean stays what the
log shows. On log 04 the floor is 0.25: 67 running, 82,123 tokens, 9 waiting at the opening."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.doctor.observed import Decode, Prefill, observe_lines
from kvadmit.doctor.reconstruct import Reconstruction
from kvadmit.doctor.resimulate import VOCAB, _window_lines, build_replay
from kvadmit.sim.run import SimConfig, simulate

PROGRESS_FLOORS = (0.0, 0.125, 0.25, 0.375, 0.5)


def waiting_at_opening(rec: Reconstruction, floor: float) -> int | None:
    """How many of the running requests are still waiting at the window's first batch line when only
    they are simulated (None: no batch line in the window)."""
    replay, warmup = build_replay(replace(rec, progress_floor=floor), running_only=True)
    start = datetime.fromtimestamp(rec.start.t - warmup, tz=timezone.utc).replace(tzinfo=None)
    spec = WorkloadSpec(num_prompts=len(replay.requests), vocab_size=VOCAB)
    cfg = SimConfig(rec.server_args(), spec, rec.cost.value, warmup_requests=0, start=start, replay=replay)
    lines: list[str] = []
    simulate(cfg, emit_log=lines.append)
    obs = observe_lines(_window_lines(lines, rec))
    first = next((e for e in obs.events if isinstance(e, Decode | Prefill)), None)
    return first.queue if first is not None else None


def opening_floor(rec: Reconstruction) -> float:
    """The lowest floor of the running requests' progress with which all of them are running when the
    window opens (0 when none is, or nothing runs then)."""
    if rec.start.running < 2:
        return 0.0
    for floor in PROGRESS_FLOORS:
        if waiting_at_opening(rec, floor) == 0:
            return floor
    return 0.0

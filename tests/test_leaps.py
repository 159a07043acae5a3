"""Leaps (sim/leap.py) change nothing but speed: over a grid of settings (both loops, page sizes 1 and 16,
chunked prefill, early stops and ignore_eos, pools small enough to retract, priorities, mixed chunks, a
concurrency limit with request latency, SGLang 0.5.23's rules, the other admission policies, one and four
replicas, decode log intervals 1 and 40), the SGLang log, the request trace and the step trace are
byte-identical with and without them, and the run took as many steps. Each setting is also checked
to have leapt at all where its workload has quiet steps, so the comparison is not vacuous."""

from __future__ import annotations

import dataclasses
import io
import itertools

import pytest

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import SchedulerKnobs, ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.fleet.driver import FleetSpec, simulate_fleet
from kvadmit.fleet.router import RouterSettings
from kvadmit.sim.run import SimConfig, simulate


def _outputs(cfg: SimConfig, replicas: int, leapt: list[int] | None = None) -> tuple[object, ...]:
    """The run's outputs and end state; `leapt` gets the number of quiet steps it ran as leaps (the sum of
    what Leaper.leap returned, SimResult.leapt: read, not patched in, so the compiled core runs it too)."""
    log: list[str] = []
    requests, steps = io.StringIO(), io.StringIO()
    if replicas == 1:
        result = simulate(cfg, emit_log=log.append, request_trace=requests, step_trace=steps)
    else:
        spec = FleetSpec(replicas, RouterSettings("round_robin"))
        result = simulate_fleet(cfg, spec, log.append, requests, steps).sim
    if leapt is not None:
        leapt.append(result.leapt)
    # and the state the outputs do not show: the same slot ids handed out, the same counters
    s = result.scheduler
    state = (s.pool._fresh, s.pool._returned.tobytes(), s.forward_ct, s.ratio.current, s.forward_ct_decode)
    return "\n".join(log), requests.getvalue(), steps.getvalue(), result.steps, state


def _config(seed: int, overlap: bool, page: int, variant: str, log_interval: int) -> SimConfig:
    pool = 6_000 if variant == "retract" else 60_000
    args = ServerArgs(
        max_total_tokens=pool,
        page_size=page,
        disable_overlap_schedule=not overlap,
        decode_log_interval=log_interval,
        chunked_prefill_size=256 if variant in ("chunked", "mixed") else None,
        enable_mixed_chunk=variant == "mixed",
        enable_priority_scheduling=variant == "priority",
        schedule_conservativeness=0.3 if variant == "retract" else 1.0,
        sglang_version="0.5.23" if variant == "v0.5.23" else "0.5.22",
        admission_policy=variant if variant in ("optimistic", "reserve-all") else "sglang",
    )
    workload = WorkloadSpec(
        num_prompts=48,
        input_len=600,
        output_len=160,
        range_ratio=0.0,
        seed=seed,
        ignore_eos=variant == "ignore_eos",
        priority_mix=((0, 0.5), (5, 0.5)) if variant == "priority" else None,
    )
    return SimConfig(
        args=args,
        workload=workload,
        cost=CostModel.simple(decode_step_ms=20.0, prefill_tokens_per_s=20_000.0),
        request_rate=8.0 if variant != "burst" else float("inf"),
        max_concurrency=12 if variant in ("burst", "latency") else None,
        warmup_requests=1,
        request_latency_s=0.005 if variant == "latency" else 0.0,
    )


VARIANTS = ("plain", "ignore_eos", "chunked", "mixed", "retract", "priority", "burst", "latency", "v0.5.23",
            "optimistic", "reserve-all")  # fmt: skip
# (page size, decode log interval): two pairings for every variant, the other two for a few
PAGES_AND_INTERVALS = {v: [(1, 40), (16, 1)] for v in VARIANTS}
for v in ("plain", "retract", "mixed", "burst"):
    PAGES_AND_INTERVALS[v] += [(1, 1), (16, 40)]
GRID = [
    (seed, overlap, page, variant, interval)
    for seed, (overlap, (variant, page, interval)) in enumerate(
        itertools.product((True, False), [(v, p, i) for v in VARIANTS for p, i in PAGES_AND_INTERVALS[v]])
    )
]


@pytest.mark.parametrize(("seed", "overlap", "page", "variant", "interval"), GRID)
def test_leaps_are_byte_identical(seed: int, overlap: bool, page: int, variant: str, interval: int) -> None:
    cfg = _config(seed, overlap, page, variant, interval)
    rounds: list[int] = []
    leapt = _outputs(cfg, 1, rounds)
    stepped = _outputs(dataclasses.replace(cfg, leaps=False), 1)
    assert leapt[0] == stepped[0], "SGLang log"
    assert leapt[1] == stepped[1], "request trace"
    assert leapt[2] == stepped[2], "step trace"
    assert leapt[3:] == stepped[3:]
    assert rounds[0] > 0, "no quiet step was found: the comparison proves nothing"


FLEET_GRID = [(True, 1, "plain"), (False, 16, "retract"), (True, 16, "burst"), (False, 1, "chunked")]


@pytest.mark.parametrize(("overlap", "page", "variant"), FLEET_GRID)
def test_fleet_leaps_are_byte_identical(overlap: bool, page: int, variant: str) -> None:
    cfg = _config(3, overlap, page, variant, 40)
    cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, num_prompts=96))
    rounds: list[int] = []
    leapt = _outputs(cfg, 4, rounds)
    stepped = _outputs(dataclasses.replace(cfg, leaps=False), 4)
    assert leapt == stepped
    assert rounds[0] > 0


def test_forced_retraction_never_leaps() -> None:
    """SGLANG_TEST_RETRACT retracts on a step count: no step is quiet, the output is unchanged."""
    cfg = _config(5, True, 1, "plain", 40)
    knobs = SchedulerKnobs(test_retract=True, test_retract_interval=7)
    cfg = dataclasses.replace(cfg, args=dataclasses.replace(cfg.args, knobs=knobs))
    rounds: list[int] = []
    leapt = _outputs(cfg, 1, rounds)
    assert rounds == [0]
    assert leapt == _outputs(dataclasses.replace(cfg, leaps=False), 1)


def test_no_leaps_flag() -> None:
    """`--no-leaps` (simulate and sweep) turns leaps off; they are on by default."""
    from kvadmit.cli import build_parser
    from kvadmit.cli.simulate import simulate_config

    base = ["simulate", "--max-total-tokens", "1000"]
    assert simulate_config(build_parser().parse_args(base)).leaps is True
    assert simulate_config(build_parser().parse_args([*base, "--no-leaps"])).leaps is False
    assert build_parser().parse_args(["sweep", "--max-total-tokens", "1000", "--no-leaps"]).no_leaps

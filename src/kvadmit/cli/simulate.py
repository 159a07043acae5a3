"""`kvadmit simulate`: the scheduler on a virtual clock, with SGLang's log lines and bench_serving's
summary; `simulate_config` turns its flags into a SimConfig (also for `sweep`)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from kvadmit.cli.flags import add_simulate_flags, check_load_flags, server_args_from
from kvadmit.cli.fleet_flags import add_fleet_flags, fleet_spec
from kvadmit.config import SIMULATED_CONTEXT_LENGTH
from kvadmit.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO

    from kvadmit.fleet.driver import FleetSpec
    from kvadmit.sim.run import SimConfig, SimResult

EXIT_ENGINE_CRASH = 1  # the simulated server died where SGLang's would (an exception in its scheduler)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "simulate",
        help="the scheduler on a virtual clock: SGLang's log lines and bench_serving's summary",
        description="Simulate a benchmark run against SGLang's scheduler on a predicted GPU: the same "
        "admission, ratio and retraction decisions, a cost model for step times, a bench_serving-like "
        "client. Prints SGLang's log lines, then bench_serving's summary block.",
    )
    add_simulate_flags(p)
    add_fleet_flags(p)
    o = p.add_argument_group("output")
    o.add_argument("--quiet", action="store_true", help="print the summary only, not the log lines")
    o.add_argument("--log-file", metavar="FILE", help="write the log lines here instead of stdout")
    o.add_argument("--trace-requests", metavar="FILE", help="one JSON line per request")
    o.add_argument("--trace-steps", metavar="FILE", help="one JSON line per step")
    p.set_defaults(func=run)


def simulate_config(ns: argparse.Namespace) -> SimConfig:
    """The SimConfig that `simulate`'s flags describe; UsageError names a bad flag."""
    from kvadmit.bench.workload import WorkloadSpec
    from kvadmit.costmodel.costmodel import CostModel, CostModelError
    from kvadmit.costmodel.costspec import resolve_cost_model
    from kvadmit.sim.replay import ReplayError, load_replay
    from kvadmit.sim.run import SimConfig

    if ns.max_total_tokens is None:
        raise UsageError("--max-total-tokens is required: the simulated GPU's KV pool size in tokens")
    check_load_flags(ns)
    args = server_args_from(ns)
    try:
        cost = (
            resolve_cost_model(ns.cost_model)
            if ns.cost_model
            else CostModel.simple(ns.decode_step_ms, ns.prefill_throughput)
        )
    except CostModelError as e:
        raise UsageError(str(e)) from None
    lens = _read_lengths(ns.output_lens_file) if ns.output_lens_file else None
    workload = WorkloadSpec(
        num_prompts=ns.num_prompts,
        input_len=ns.random_input_len,
        output_len=ns.random_output_len,
        range_ratio=ns.random_range_ratio,
        seed=ns.seed,
        vocab_size=ns.vocab_size,
        ignore_eos=not ns.disable_ignore_eos,
        max_new_tokens=ns.max_new_tokens,
        stop=ns.stop_distribution,
        output_lens=lens,
        priority_mix=ns.priority_mix,
    )
    try:
        workload.validate()
        if not ns.request_latency_ms >= 0:
            raise ValueError(f"--request-latency-ms must be ≥ 0, got {ns.request_latency_ms}")
        replay = load_replay(ns.replay, ns.vocab_size, ns.seed) if ns.replay else None
    except (ValueError, ReplayError) as e:
        raise UsageError(str(e)) from None
    by_step = getattr(ns, "replay_arrival", "time") == "step"
    if by_step and replay is None:
        raise UsageError("--replay-arrival step needs --replay TRACE.jsonl")
    if by_step and replay is not None and replay.step_problems:
        more = len(replay.step_problems) - 1
        raise UsageError(
            f"--replay-arrival step cannot replay {ns.replay!r} step for step: {replay.step_problems[0]}"
            + (f" (and {more} more)" if more else "")
            + "; replay it by time instead"
        )
    if by_step and (ns.max_concurrency is not None or ns.request_latency_ms):
        raise UsageError("--replay-arrival step hands each request over after the step it followed on the "
                         "server: --max-concurrency and --request-latency-ms do not apply")  # fmt: skip
    return SimConfig(
        args=args,
        workload=workload,
        cost=cost,
        request_rate=ns.request_rate,
        # a replayed bench run keeps its client's limit unless one is given
        max_concurrency=ns.max_concurrency or (replay.max_concurrency if replay else None),
        warmup_requests=ns.warmup_requests,
        context_len=ns.context_length or SIMULATED_CONTEXT_LENGTH,
        backend=ns.backend,
        replay=replay,
        request_latency_s=ns.request_latency_ms / 1000,
        replay_by_step=by_step,
        leaps=not getattr(ns, "no_leaps", False),
    )


def run(ns: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from kvadmit.bench.priority_classes import render_priority_classes
    from kvadmit.bench.summary import render_summary
    from kvadmit.observe.startup import loop_line
    from kvadmit.scheduler.errors import EngineCrash
    from kvadmit.sim.run import WarmupFailed, simulate

    cfg = simulate_config(ns)
    fleet = fleet_spec(ns)
    table = None
    with ExitStack() as stack:
        try:
            log = stack.enter_context(open(ns.log_file, "w", encoding="utf-8")) if ns.log_file else sys.stdout
            requests = stack.enter_context(open(ns.trace_requests, "w")) if ns.trace_requests else None
            steps = stack.enter_context(open(ns.trace_steps, "w")) if ns.trace_steps else None
        except OSError as e:
            raise UsageError(f"cannot write {e.filename!r}: {e.strerror}") from None
        emit = None if ns.quiet else (lambda line: log.write(line + "\n"))
        if emit is not None:
            emit(loop_line(cfg.args))
        try:
            if fleet is None:
                result = simulate(cfg, emit_log=emit, request_trace=requests, step_trace=steps)
            else:
                result, table = _simulate_fleet(cfg, fleet, emit, requests, steps)
        except WarmupFailed as e:
            raise UsageError(str(e)) from None
        except EngineCrash as crash:  # where SGLang's scheduler raises, its server dies: the run ends here
            version = cfg.args.sglang_version
            print(f"kvadmit simulate: the simulated SGLang {version} server died: {crash}", file=sys.stderr)
            return EXIT_ENGINE_CRASH
    failed = [o for o in result.outcomes if not o.success]
    if failed:
        print(
            f"{len(failed)} of {len(result.outcomes)} requests failed; the first: {failed[0].error}",
            file=sys.stderr,
        )
    print(
        render_summary(
            result.metrics,
            backend=ns.backend,
            request_rate=ns.request_rate,
            max_concurrency=ns.max_concurrency,
            duration_s=result.duration_s,
        )
    )
    if table is not None:
        print(table)
    by_priority = render_priority_classes(result.outcomes)
    if by_priority is not None:
        print(by_priority)
    return 0


def _simulate_fleet(
    cfg: SimConfig,
    fleet: FleetSpec,
    emit: Callable[[str], None] | None,
    requests: IO[str] | None,
    steps: IO[str] | None,
) -> tuple[SimResult, str | None]:
    """The fleet's run over all requests, and its per-replica table (None for one replica, whose output is
    plain `simulate`'s)."""
    from kvadmit.fleet.driver import simulate_fleet
    from kvadmit.fleet.report import render_replica_table

    result = simulate_fleet(cfg, fleet, emit_log=emit, request_trace=requests, step_trace=steps)
    if fleet.replicas == 1:
        return result.sim, None
    return result.sim, f"\n{fleet.describe()}:\n" + render_replica_table(result)


def _read_lengths(path: str) -> tuple[int, ...]:
    try:
        with open(path, encoding="utf-8") as f:
            words = f.read().split()
    except OSError as e:
        raise UsageError(f"cannot read {path!r}: {e.strerror}") from None
    try:
        return tuple(int(w) for w in words)
    except ValueError:
        raise UsageError(f"{path!r} must hold one positive integer per line") from None

"""`kvadmit capacity`: how many requests fit in a KV pool and why; or, for a snapshot, who is admitted."""

from __future__ import annotations

import argparse
import json
import sys

from kvadmit.cli.flags import add_scheduler_flags, server_args_from
from kvadmit.errors import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "capacity",
        help="how many requests fit in a pool, and why a given request waits",
        description="How many requests run at once in a KV pool, and why; or, for a snapshot "
        "(--scenario), which waiting requests are admitted and why the rest wait, or which running "
        "requests a decode step retracts.",
    )
    add_scheduler_flags(p)
    p.add_argument("--input-len", type=int, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, help="max_new_tokens per request")
    p.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="requests may stop early: running ones reserve remaining × the new-token ratio",
    )
    p.add_argument("--ratio", type=float, help="assume this new-token ratio")
    p.add_argument(
        "--scenario", metavar="FILE", help="a snapshot (JSON) or many (JSONL), see docs/architecture.md"
    )
    p.add_argument("--replicas", type=int, default=1, metavar="N", help="N replicas behind a router (or "
                   "--dp-size N), each with this pool: the fleet's answer too")  # fmt: skip
    p.add_argument("--json", action="store_true", help="answer in JSON")
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    if ns.scenario:
        from kvadmit.capacity.scenario import run_scenario_file

        return run_scenario_file(ns.scenario, as_json=ns.json, out=sys.stdout, err=sys.stderr)
    from kvadmit.capacity.fit import CapacityError, FitQuestion, explain_fit

    if ns.max_total_tokens is None or ns.input_len is None or ns.output_len is None:
        raise UsageError("give --max-total-tokens, --input-len and --output-len, or --scenario FILE")
    if ns.replicas < 1:
        raise UsageError(f"--replicas must be ≥ 1, got {ns.replicas}")
    if ns.ratio is not None and not 0 <= ns.ratio <= 1:
        raise UsageError(f"--ratio must be between 0 and 1, got {ns.ratio}")
    args = server_args_from(ns)
    q = FitQuestion(args, ns.input_len, ns.output_len, ignore_eos=not ns.no_ignore_eos, ratio=ns.ratio)
    try:
        result = explain_fit(q)
    except CapacityError as e:
        raise UsageError(str(e)) from None
    if ns.replicas > 1:
        _add_fleet(result, ns.replicas)
    if ns.json:
        print(json.dumps(result))
    else:
        for line in result["explanation"]:  # type: ignore[union-attr]
            print(line)
    return 0


def _add_fleet(result: dict[str, object], n: int) -> None:
    """The answer for n replicas, each with its own pool: n times each count, when the router fills all."""
    running, first = result["running_at_once"], result["first_pass_admitted"]
    assert isinstance(running, int) and isinstance(first, int)
    result["replicas"] = n
    result["fleet_running_at_once"] = n * running
    result["fleet_first_pass_admitted"] = n * first
    explanation = result["explanation"]
    assert isinstance(explanation, list)
    explanation.append(
        f"Over {n} replicas, each with a pool of its own: {n} × {running:,} = {n * running:,} run at once "
        f"({n} × {first:,} = {n * first:,} in the first passes) when the router keeps every replica full. "
        "round_robin spreads requests evenly; power_of_two and cache_aware route on stale or partial loads "
        "and can leave one replica queueing while another has room (`kvadmit simulate --replicas N "
        "--router POLICY` shows it)."
    )

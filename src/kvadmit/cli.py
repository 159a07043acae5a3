"""`kvadmit <command>`: the command line. Each command's flags use SGLang's names; bad input gives one
line naming the problem and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from kvadmit.config import SCHEDULE_POLICIES, ConfigError, SchedulerKnobs, ServerArgs
from kvadmit.errors import UsageError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def add_scheduler_flags(p: argparse.ArgumentParser, *, pool_required: bool = False) -> None:
    """The scheduler's server arguments, with SGLang's flag names and defaults."""
    d = ServerArgs()
    g = p.add_argument_group("scheduler (SGLang server arguments)")
    g.add_argument(
        "--max-total-tokens",
        type=int,
        required=pool_required,
        default=d.max_total_tokens,
        help="KV pool size in tokens",
    )
    g.add_argument("--page-size", type=int, default=d.page_size)
    g.add_argument("--schedule-conservativeness", type=float, default=d.schedule_conservativeness)
    g.add_argument("--max-running-requests", type=int, default=d.max_running_requests)
    g.add_argument("--max-queued-requests", type=int, default=d.max_queued_requests)
    g.add_argument("--max-prefill-tokens", type=int, default=d.max_prefill_tokens)
    g.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=d.chunked_prefill_size,
        help="-1 disables chunked prefill (default: by device memory; 4096 when unknown)",
    )
    g.add_argument("--prefill-max-requests", type=int, default=d.prefill_max_requests)
    g.add_argument("--schedule-policy", choices=SCHEDULE_POLICIES, default=d.schedule_policy)
    g.add_argument("--disable-radix-cache", action="store_true")
    g.add_argument("--decode-log-interval", type=int, default=d.decode_log_interval)
    g.add_argument("--context-length", type=int, default=d.context_length)
    g.add_argument("--random-seed", type=int, default=d.random_seed)
    g.add_argument(
        "--sglang-version",
        default=d.sglang_version,
        help="reproduce this SGLang release's rules (0.5.22 default; earlier: classic rules)",
    )


def server_args_from(ns: argparse.Namespace) -> ServerArgs:
    try:
        args = ServerArgs(
            max_total_tokens=ns.max_total_tokens,
            page_size=ns.page_size,
            schedule_conservativeness=ns.schedule_conservativeness,
            max_running_requests=ns.max_running_requests,
            max_queued_requests=ns.max_queued_requests,
            max_prefill_tokens=ns.max_prefill_tokens,
            chunked_prefill_size=ns.chunked_prefill_size,
            prefill_max_requests=ns.prefill_max_requests,
            schedule_policy=ns.schedule_policy,
            disable_radix_cache=ns.disable_radix_cache,
            decode_log_interval=ns.decode_log_interval,
            context_length=ns.context_length,
            random_seed=ns.random_seed,
            sglang_version=ns.sglang_version,
            knobs=SchedulerKnobs.from_environ(),
        )
        args.check_startup()
    except ConfigError as e:
        raise UsageError(str(e)) from None
    return args


def _capacity_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
    p.add_argument("--scenario", metavar="FILE", help="a snapshot (JSON) or many (JSONL), see DESIGN.md")
    p.add_argument("--json", action="store_true", help="answer in JSON")
    p.set_defaults(func=_run_capacity)


def _run_capacity(ns: argparse.Namespace) -> int:
    if ns.scenario:
        from kvadmit.capacity.scenario import run_scenario_file

        return run_scenario_file(ns.scenario, as_json=ns.json, out=sys.stdout)
    from kvadmit.capacity.fit import CapacityError, FitQuestion, explain_fit

    if ns.max_total_tokens is None or ns.input_len is None or ns.output_len is None:
        raise UsageError("give --max-total-tokens, --input-len and --output-len, or --scenario FILE")
    if ns.ratio is not None and not 0 <= ns.ratio <= 1:
        raise UsageError(f"--ratio must be between 0 and 1, got {ns.ratio}")
    args = server_args_from(ns)
    q = FitQuestion(args, ns.input_len, ns.output_len, ignore_eos=not ns.no_ignore_eos, ratio=ns.ratio)
    try:
        result = explain_fit(q)
    except CapacityError as e:
        raise UsageError(str(e)) from None
    if ns.json:
        print(json.dumps(result))
    else:
        for line in result["explanation"]:  # type: ignore[union-attr]
            print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvadmit", description="Why LLM serving requests wait: SGLang's admission, exactly."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _capacity_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return int(ns.func(ns))
    except UsageError as e:
        print(f"kvadmit {ns.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())

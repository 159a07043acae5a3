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


def _simulate_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "simulate",
        help="the scheduler on a virtual clock: SGLang's log lines and bench_serving's summary",
        description="Simulate a benchmark run against SGLang's scheduler on a predicted GPU: the same "
        "admission, ratio and retraction decisions, a cost model for step times, a bench_serving-like "
        "client. Prints SGLang's log lines, then bench_serving's summary block.",
    )
    add_scheduler_flags(p)
    w = p.add_argument_group("workload (bench_serving's flags)")
    w.add_argument("--backend", default="sglang", help="the name printed in the summary")
    w.add_argument("--num-prompts", type=int, default=1000)
    w.add_argument("--random-input-len", type=int, default=1024)
    w.add_argument("--random-output-len", type=int, default=1024)
    w.add_argument("--random-range-ratio", type=float, default=0.0)
    w.add_argument("--request-rate", type=float, default=float("inf"))
    w.add_argument("--max-concurrency", type=int, default=None)
    w.add_argument("--disable-ignore-eos", action="store_true")
    w.add_argument("--seed", type=int, default=42)
    w.add_argument("--warmup-requests", type=int, default=1)
    w.add_argument("--vocab-size", type=int, default=32000, help="for random-ids prompts")
    w.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="clients ask for this many tokens (they still stop at their drawn length)",
    )
    w.add_argument(
        "--stop-distribution",
        choices=("uniform", "full"),
        default="uniform",
        help="without ignore_eos: stop uniformly in [1, max_new_tokens], or at the drawn length",
    )
    w.add_argument(
        "--output-lens-file",
        metavar="FILE",
        help="true output lengths, one integer per line (cycled), instead of a distribution",
    )
    c = p.add_argument_group("cost model")
    c.add_argument("--decode-step-ms", type=float, default=20.0)
    c.add_argument("--prefill-throughput", type=float, default=10_000.0, help="prefill tokens/s")
    c.add_argument("--cost-model", metavar="FILE", help="a JSON cost model (see executor/costmodel.py)")
    o = p.add_argument_group("output")
    o.add_argument("--quiet", action="store_true", help="print the summary only, not the log lines")
    o.add_argument("--log-file", metavar="FILE", help="write the log lines here instead of stdout")
    o.add_argument("--trace-requests", metavar="FILE", help="one JSON line per request")
    o.add_argument("--trace-steps", metavar="FILE", help="one JSON line per step")
    p.set_defaults(func=_run_simulate)


def _run_simulate(ns: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from kvadmit.bench.summary import render_summary
    from kvadmit.executor.costmodel import CostModel, CostModelError
    from kvadmit.sim.run import SimConfig, WarmupFailed, simulate
    from kvadmit.sim.workload import WorkloadSpec

    if ns.max_total_tokens is None:
        raise UsageError("--max-total-tokens is required: the simulated GPU's KV pool size in tokens")
    if ns.max_concurrency is not None and ns.max_concurrency <= 0:
        raise UsageError(f"--max-concurrency must be a positive integer, got {ns.max_concurrency}")
    if not ns.request_rate > 0:
        raise UsageError(f"--request-rate must be > 0 (or inf), got {ns.request_rate}")
    if ns.warmup_requests < 0:
        raise UsageError(f"--warmup-requests must be ≥ 0, got {ns.warmup_requests}")
    args = server_args_from(ns)
    try:
        cost = (
            CostModel.from_file(ns.cost_model)
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
    )
    try:
        workload.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    cfg = SimConfig(
        args=args,
        workload=workload,
        cost=cost,
        request_rate=ns.request_rate,
        max_concurrency=ns.max_concurrency,
        warmup_requests=ns.warmup_requests,
        context_len=ns.context_length or 32768,
        backend=ns.backend,
    )
    with ExitStack() as stack:
        try:
            log = stack.enter_context(open(ns.log_file, "w", encoding="utf-8")) if ns.log_file else sys.stdout
            requests = stack.enter_context(open(ns.trace_requests, "w")) if ns.trace_requests else None
            steps = stack.enter_context(open(ns.trace_steps, "w")) if ns.trace_steps else None
        except OSError as e:
            raise UsageError(f"cannot write {e.filename!r}: {e.strerror}") from None
        emit = None if ns.quiet else (lambda line: log.write(line + "\n"))
        try:
            result = simulate(cfg, emit_log=emit, request_trace=requests, step_trace=steps)
        except WarmupFailed as e:
            raise UsageError(str(e)) from None
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
    return 0


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


def _generate_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("generate", help="generate text offline with the real model (kvadmit.Engine)")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument(
        "--model-path", default=None, help="an HF folder or a .gguf file (default: SmolLM2-135M-Instruct)"
    )
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="auto: bfloat16 where the CPU/GPU computes it natively, else float32 (CPU) / float16 (GPU)",
    )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--json", action="store_true", help="print text, output ids and meta info as JSON")
    p.set_defaults(func=_run_generate)


def _run_generate(ns: argparse.Namespace) -> int:
    from pathlib import Path

    if ns.model_path is not None and not Path(ns.model_path).exists():
        raise UsageError(f"--model-path {ns.model_path!r} does not exist")
    from kvadmit.api import Engine
    from kvadmit.model.default import DefaultModelError
    from kvadmit.model.loading import ModelLoadError
    from kvadmit.sampling_params import SamplingError

    params = {"max_new_tokens": ns.max_new_tokens, "temperature": ns.temperature, "top_p": ns.top_p,
              "top_k": ns.top_k, "sampling_seed": ns.seed}  # fmt: skip
    try:
        engine = Engine(ns.model_path, dtype=ns.dtype, device=ns.device, max_total_tokens=ns.max_total_tokens)
        if ns.chat:
            out = engine.chat([{"role": "user", "content": ns.prompt}], params)
        else:
            out = engine.generate(ns.prompt, params)
    except (ModelLoadError, DefaultModelError, SamplingError, ConfigError) as e:
        raise UsageError(str(e)) from None
    assert isinstance(out, dict)
    print(json.dumps(out) if ns.json else out["text"])
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvadmit", description="Why LLM serving requests wait: SGLang's admission, exactly."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _capacity_parser(sub)
    _simulate_parser(sub)
    _generate_parser(sub)
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

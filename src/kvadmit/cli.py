"""`kvadmit <command>`: the command line. Each command's flags use SGLang's names; bad input gives one
line naming the problem and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from kvadmit.config import ADMISSION_POLICIES, SCHEDULE_POLICIES, ConfigError, SchedulerKnobs, ServerArgs
from kvadmit.errors import UsageError

if TYPE_CHECKING:
    from kvadmit.sim.run import SimConfig

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
            admission_policy=getattr(ns, "admission_policy", ServerArgs().admission_policy),
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
    add_simulate_flags(p)
    o = p.add_argument_group("output")
    o.add_argument("--quiet", action="store_true", help="print the summary only, not the log lines")
    o.add_argument("--log-file", metavar="FILE", help="write the log lines here instead of stdout")
    o.add_argument("--trace-requests", metavar="FILE", help="one JSON line per request")
    o.add_argument("--trace-steps", metavar="FILE", help="one JSON line per step")
    p.set_defaults(func=_run_simulate)


def add_policy_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--admission-policy",
        choices=ADMISSION_POLICIES,
        default=ServerArgs().admission_policy,
        help="sglang: SGLang's forecast (default); reserve-all: every request reserves its full "
        "max_new_tokens; optimistic: no output reservation, preempt the newest when the pool fills "
        "(as vLLM V1 does)",
    )


def add_simulate_flags(p: argparse.ArgumentParser) -> None:
    """Server, workload and cost-model flags of `simulate` (also read by `sweep`)."""
    add_scheduler_flags(p)
    add_policy_flag(p)
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
    w.add_argument(
        "--request-latency-ms",
        type=float,
        default=0.0,
        help="from the client sending a request to the scheduler seeing it (HTTP, parsing, the engine's "
        "queue); above 0, a request sent as a step ends waits for the step after it, as on a real server",
    )
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
    w.add_argument(
        "--replay",
        metavar="TRACE.jsonl",
        help="send the requests of a trace (arrival, prompt_len, max_new_tokens, output_len, ignore_eos "
        "per line, as --trace-requests writes; or the file kvadmit bench --output-file F --output-details "
        "writes) instead of drawing a workload",
    )
    w.add_argument(
        "--replay-arrival",
        choices=("time", "step"),
        default="time",
        help="time: send each request at its arrival time; step: hand it to the scheduler right after "
        "the step it followed on the server (a trace from kvadmit serve --trace-requests), so every "
        "decision can be compared with the server's step for step (no warm-up, no client limit)",
    )
    c = p.add_argument_group("cost model")
    c.add_argument("--decode-step-ms", type=float, default=20.0)
    c.add_argument("--prefill-throughput", type=float, default=10_000.0, help="prefill tokens/s")
    c.add_argument(
        "--cost-model",
        metavar="SPEC",
        help="a JSON cost model (kvadmit calibrate / profile / cost-model write one), or a roofline "
        "preset GPU:MODEL[:tp=N], e.g. h100:llama-3-8b (see kvadmit cost-model --list)",
    )


def simulate_config(ns: argparse.Namespace) -> SimConfig:
    """The SimConfig that `simulate`'s flags describe; UsageError names a bad flag."""
    from kvadmit.bench.workload import WorkloadSpec
    from kvadmit.costmodel.costmodel import CostModel, CostModelError
    from kvadmit.costmodel.costspec import resolve_cost_model
    from kvadmit.sim.replay import ReplayError, load_replay
    from kvadmit.sim.run import SimConfig

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
        context_len=ns.context_length or 32768,
        backend=ns.backend,
        replay=replay,
        request_latency_s=ns.request_latency_ms / 1000,
        replay_by_step=by_step,
    )


def _run_simulate(ns: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from kvadmit.bench.summary import render_summary
    from kvadmit.sim.run import WarmupFailed, simulate

    cfg = simulate_config(ns)
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
    from kvadmit.model.default import DefaultModelError
    from kvadmit.model.loading import ModelLoadError
    from kvadmit.offline import OfflineEngine as Engine
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


def _serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from kvadmit.server.main import add_serve_flags

    p = sub.add_parser(
        "serve",
        help="an OpenAI-compatible LLM server with SGLang's scheduler, log lines and metrics",
        description="Serve a model (default: SmolLM2-135M-Instruct) over HTTP with SGLang's endpoints, "
        "or, with --simulate COST_MODEL, a predicted GPU that admits, queues and retracts like one.",
    )
    add_scheduler_flags(p)
    add_policy_flag(p)
    add_serve_flags(p)
    p.set_defaults(func=_run_serve)


def _run_serve(ns: argparse.Namespace) -> int:
    from kvadmit.server.main import serve

    return serve(ns, server_args_from(ns))


def _doctor_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "doctor",
        help="read a server log and metrics: a healthy queue or a retraction problem, why, and what to do",
        description="Diagnose an SGLang (or vLLM) server from its log and/or Prometheus metrics: a healthy "
        "queue, an idle pool with a queue, occasional retraction or a storm, a throughput collapse, "
        "out-of-memory aborts, or failures unrelated to the KV pool. The verdict comes first, with the "
        "quoted lines that show it and what to do.",
    )
    p.add_argument(
        "log", nargs="?", help="the server log (plain, .gz, .bz2 or .xz; '-' reads standard input)"
    )
    p.add_argument(
        "--metrics",
        action="append",
        default=[],
        metavar="FILE",
        help="a /metrics scrape (Prometheus text); give it twice for counter rates",
    )
    p.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="seconds between the --metrics files (default: their modification times)",
    )
    p.add_argument("--watch", metavar="URL", help="scrape this server's /metrics over --for SECONDS")
    p.add_argument("--for", dest="for_s", type=float, metavar="SECONDS", help="how long to --watch")
    p.add_argument("--every", type=float, default=5.0, metavar="SECONDS", help="--watch scrape interval")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with charts")
    p.set_defaults(func=_run_doctor)


def _run_doctor(ns: argparse.Namespace) -> int:
    from kvadmit.doctor.diagnose import Inputs, diagnose
    from kvadmit.doctor.report import render_json, render_text
    from kvadmit.doctor.source import DoctorInputError

    if ns.log is None and not ns.metrics and not ns.watch:
        raise UsageError("give a log file, --metrics FILE or --watch URL --for SECONDS")
    if ns.watch and ns.for_s is None:
        raise UsageError("--watch needs --for SECONDS (how long to watch)")
    if ns.for_s is not None and not ns.watch:
        raise UsageError("--for goes with --watch URL")
    if ns.interval is not None and not ns.interval > 0:
        raise UsageError(f"--interval must be a positive number of seconds, got {ns.interval:g}")
    if not ns.every > 0:
        raise UsageError(f"--every must be a positive number of seconds, got {ns.every:g}")
    try:
        inputs = Inputs(log=ns.log, metrics=list(ns.metrics), interval_s=ns.interval)
        if ns.watch:
            from kvadmit.doctor.watch import watch

            inputs.scrapes = watch(ns.watch, ns.for_s, every=ns.every)
        result = diagnose(inputs)
    except DoctorInputError as e:
        raise UsageError(str(e)) from None
    if ns.html:
        from kvadmit.doctor.html import render_html

        try:
            with open(ns.html, "w", encoding="utf-8") as f:
                f.write(render_html(result))
        except OSError as e:
            raise UsageError(f"cannot write {ns.html!r}: {e.strerror}") from None
    print(render_json(result) if ns.json else render_text(result))
    return 0


def _bench_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from kvadmit.bench.backends import BACKENDS
    from kvadmit.bench.datasets import DATASETS, DatasetSpec

    d = DatasetSpec()
    p = sub.add_parser(
        "bench",
        help="a load generator that reports what SGLang's bench_serving reports",
        description="Benchmark a running server (kvadmit serve, SGLang, vLLM or any OpenAI-compatible "
        "one) with bench_serving's flags, datasets and metric definitions; prints bench_serving's "
        "summary block.",
    )
    s = p.add_argument_group("server")
    s.add_argument("--backend", choices=list(BACKENDS), default="sglang",
                   help="sglang/sglang-native: /generate; sglang-oai, vllm: /v1/completions; "
                   "sglang-oai-chat, vllm-chat: /v1/chat/completions")  # fmt: skip
    s.add_argument("--base-url", default=None, help="the server's URL (instead of --host and --port)")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, default=None, help="default: 30000 (sglang*), 8000 (vllm*)")
    s.add_argument("--model", default=None, help="model name sent to OpenAI APIs (default: /v1/models)")
    s.add_argument("--tokenizer", default=None,
                   help="a tokenizer folder, tokenizer.json or hub name (default: the server's "
                   "/model_info tokenizer_path, then --model)")  # fmt: skip
    s.add_argument("--ready-check-timeout-sec", type=float, default=60.0,
                   help="wait this long for the server to answer /v1/models")  # fmt: skip
    w = p.add_argument_group("dataset (bench_serving's flags)")
    w.add_argument("--dataset-name", choices=DATASETS, default="sharegpt")
    w.add_argument("--dataset-path", default="", help="a local ShareGPT JSON file (sharegpt, random)")
    w.add_argument("--num-prompts", type=int, default=d.num_prompts)
    w.add_argument("--random-input-len", type=int, default=d.input_len)
    w.add_argument("--random-output-len", type=int, default=d.output_len)
    w.add_argument("--random-range-ratio", type=float, default=d.range_ratio)
    w.add_argument("--tokenize-prompt", action="store_true", help="random-ids: send token ids, not text")
    w.add_argument("--sharegpt-output-len", type=int, default=None)
    w.add_argument("--sharegpt-context-len", type=int, default=None)
    w.add_argument("--gsp-num-groups", type=int, default=d.gsp_num_groups)
    w.add_argument("--gsp-prompts-per-group", type=int, default=d.gsp_prompts_per_group)
    w.add_argument("--gsp-system-prompt-len", type=int, default=d.gsp_system_prompt_len)
    w.add_argument("--gsp-question-len", type=int, default=d.gsp_question_len)
    w.add_argument("--gsp-output-len", type=int, default=d.gsp_output_len)
    w.add_argument("--seed", type=int, default=d.seed)
    t = p.add_argument_group("traffic")
    t.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals (default inf: all at once)")  # fmt: skip
    t.add_argument("--max-concurrency", type=int, default=None)
    t.add_argument("--disable-ignore-eos", action="store_true")
    t.add_argument("--disable-stream", action="store_true")
    t.add_argument("--extra-request-body", metavar="JSON", default=None,
                   help="a JSON object merged into every request body")  # fmt: skip
    t.add_argument("--warmup-requests", type=int, default=1)
    t.add_argument("--flush-cache", action="store_true", help="POST /flush_cache after the warm-up")
    o = p.add_argument_group("output")
    o.add_argument("--output-file", metavar="FILE", help="append one JSON line per run")
    o.add_argument("--output-details", action="store_true", help="add per-request lists to the line")
    o.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_bench)


def _run_bench(ns: argparse.Namespace) -> int:
    from kvadmit.bench.client import Traffic
    from kvadmit.bench.datasets import DatasetSpec
    from kvadmit.bench.run import BenchConfig, BenchError, run_bench

    if ns.num_prompts <= 0:
        raise UsageError(f"--num-prompts must be positive, got {ns.num_prompts}")
    if ns.max_concurrency is not None and ns.max_concurrency <= 0:
        raise UsageError(f"--max-concurrency must be a positive integer, got {ns.max_concurrency}")
    if not ns.request_rate > 0:
        raise UsageError(f"--request-rate must be > 0 (or inf), got {ns.request_rate}")
    if ns.warmup_requests < 0:
        raise UsageError(f"--warmup-requests must be ≥ 0, got {ns.warmup_requests}")
    if ns.port is not None and not 0 < ns.port < 65536:
        raise UsageError(f"--port must be within 1..65535, got {ns.port}")
    if ns.ready_check_timeout_sec < 0:
        raise UsageError(f"--ready-check-timeout-sec must be ≥ 0, got {ns.ready_check_timeout_sec}")
    if ns.tokenize_prompt and ns.dataset_name != "random-ids":
        raise UsageError("--tokenize-prompt works with --dataset-name random-ids only")
    if ns.dataset_name == "sharegpt" and not ns.dataset_path:
        raise UsageError(
            "--dataset-name sharegpt (the default) needs --dataset-path, a local ShareGPT JSON file "
            "(kvadmit never downloads it); or use --dataset-name random-ids or random"
        )
    extra: dict[str, object] = {}
    if ns.extra_request_body:
        try:
            extra = json.loads(ns.extra_request_body)
        except json.JSONDecodeError as e:
            raise UsageError(f"--extra-request-body is not JSON: {e}") from None
        if not isinstance(extra, dict):
            raise UsageError("--extra-request-body must be a JSON object")
    dataset = DatasetSpec(
        name=ns.dataset_name, num_prompts=ns.num_prompts, input_len=ns.random_input_len,
        output_len=ns.random_output_len, range_ratio=ns.random_range_ratio, seed=ns.seed,
        dataset_path=ns.dataset_path, tokenize_prompt=ns.tokenize_prompt,
        sharegpt_output_len=ns.sharegpt_output_len, sharegpt_context_len=ns.sharegpt_context_len,
        gsp_num_groups=ns.gsp_num_groups, gsp_prompts_per_group=ns.gsp_prompts_per_group,
        gsp_system_prompt_len=ns.gsp_system_prompt_len, gsp_question_len=ns.gsp_question_len,
        gsp_output_len=ns.gsp_output_len,
    )  # fmt: skip
    cfg = BenchConfig(
        backend=ns.backend, base_url=ns.base_url, host=ns.host, port=ns.port, model=ns.model,
        tokenizer=ns.tokenizer, dataset=dataset,
        traffic=Traffic(request_rate=ns.request_rate, max_concurrency=ns.max_concurrency),
        ignore_eos=not ns.disable_ignore_eos, stream=not ns.disable_stream, extra_request_body=extra,
        warmup_requests=ns.warmup_requests, flush_cache=ns.flush_cache, output_file=ns.output_file,
        output_details=ns.output_details, disable_tqdm=ns.disable_tqdm,
        ready_check_timeout_s=ns.ready_check_timeout_sec,
    )  # fmt: skip
    try:
        return run_bench(cfg)
    except BenchError as e:
        print(f"kvadmit bench: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kvadmit bench: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvadmit", description="Why LLM serving requests wait: SGLang's admission, exactly."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _capacity_parser(sub)
    _simulate_parser(sub)
    _generate_parser(sub)
    _serve_parser(sub)
    _doctor_parser(sub)
    _bench_parser(sub)
    _sim_trust_parsers(sub)
    return parser


def _sim_trust_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Cost models (calibrate, profile, cost-model) and sweeps: commands/."""
    from kvadmit.commands import costs, profile, sweep

    costs.calibrate_parser(sub)
    profile.profile_parser(sub)
    costs.cost_model_parser(sub)
    sweep.sweep_parser(sub)


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

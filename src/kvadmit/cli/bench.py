"""`kvadmit bench`: a load generator that reports what SGLang's bench_serving reports."""

from __future__ import annotations

import argparse
import json
import sys

from kvadmit.cli.flags import add_priority_mix_flag, check_load_flags
from kvadmit.errors import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
    add_priority_mix_flag(t)
    t.add_argument("--flush-cache", action="store_true", help="POST /flush_cache after the warm-up")
    o = p.add_argument_group("output")
    o.add_argument("--output-file", metavar="FILE", help="append one JSON line per run")
    o.add_argument("--output-details", action="store_true", help="add per-request lists to the line")
    o.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from kvadmit.bench.client import Traffic
    from kvadmit.bench.datasets import DatasetSpec
    from kvadmit.bench.run import BenchConfig, BenchError, run_bench

    if ns.num_prompts <= 0:
        raise UsageError(f"--num-prompts must be positive, got {ns.num_prompts}")
    check_load_flags(ns)
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
        ready_check_timeout_s=ns.ready_check_timeout_sec, priority_mix=ns.priority_mix,
    )  # fmt: skip
    try:
        return run_bench(cfg)
    except BenchError as e:
        print(f"kvadmit bench: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kvadmit bench: interrupted", file=sys.stderr)
        return 130
